/* cmd_forward.c — placeholder until the 'forward' command lands. */
#include "cli.h"

int cmd_forward(int argc, char **argv) {
    (void)argc; (void)argv;
    return cli_error("'forward' is not available in this build yet");
}
