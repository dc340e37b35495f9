/* cmd_convert.c — placeholder until the 'convert' command lands (the command reports that it is unavailable). */
#include "cli.h"

int cmd_convert(int argc, char **argv) {
    (void)argc; (void)argv;
    return cli_error("'convert' is not available in this build yet");
}
