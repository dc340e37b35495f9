/* page.h — the web page served at GET / (web/index.html, turned into a C array at build time by the Makefile). */
#ifndef DT_SERVE_PAGE_H
#define DT_SERVE_PAGE_H

#include <stddef.h>

extern const unsigned char dt_serve_page_html[];
extern const size_t dt_serve_page_html_len;

#endif
