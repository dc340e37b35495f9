/* cli.h — subcommands of the ditrun command; each lives in its own cmd_*.c file.
 * Every command parses its own options, prints usage on --help, and returns the process exit code. */
#ifndef DT_CLI_H
#define DT_CLI_H

#include "backends/backend.h"
#include "backends/backend_ext.h"

int cmd_info(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* Shared helpers (cli_util.c). */
int cli_error(const char *fmt, ...);                 /* prints "ditrun: error: ..." and returns 1 */
int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);   /* 0 ok, else error printed */
/* A byte count with an optional binary suffix K, M, G or T (and "B" / "iB"), e.g. 12G; -1 with the error printed. */
int64_t cli_parse_bytes(const char *opt, const char *s);
int cli_parse_float(const char *opt, const char *s, double *out);
/* Before the work starts: OUT can be written (core/outfile.h: its folder exists and accepts a file, it is not a
 * folder or a block device) and is not the same file as IN1 / IN2 or a file under them (NULL: none).
 * 0 ok; else prints the error and returns 1. */
int cli_check_output(const char *out, const char *in1, const char *in2);
/* Before the work starts: the input at path exists and is a regular file (want_file) or a file or folder, not a FIFO,
 * device or loop (core/infile.h). 0 ok; else prints the error and returns 1. */
int cli_check_input(const char *path, int want_file);

/* Logs one line on the GPU's clock and power across repeated timed runs (nothing when the summary is empty):
 * median SM clock and power, how many samples were power-capped. what = the runs ("forwards"). */
void cli_power_report(const dt_power_summary *s, const char *what);

#endif
