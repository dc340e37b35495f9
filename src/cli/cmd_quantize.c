/* cmd_quantize.c — placeholder until the 'quantize' command lands (the command reports that it is unavailable). */
#include "cli.h"

int cmd_quantize(int argc, char **argv) {
    (void)argc; (void)argv;
    return cli_error("'quantize' is not available in this build yet");
}
