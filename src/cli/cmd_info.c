/* cmd_info.c — placeholder until the 'info' command lands. */
#include "cli.h"

int cmd_info(int argc, char **argv) {
    (void)argc; (void)argv;
    return cli_error("'info' is not available in this build yet");
}
