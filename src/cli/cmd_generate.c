/* cmd_generate.c — placeholder until the 'generate' command lands (the command reports that it is unavailable). */
#include "cli.h"

int cmd_generate(int argc, char **argv) {
    (void)argc; (void)argv;
    return cli_error("'generate' is not available in this build yet");
}
