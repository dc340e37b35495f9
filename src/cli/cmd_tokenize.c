/* cmd_tokenize.c — placeholder until the 'tokenize' command lands (the command reports that it is unavailable). */
#include "cli.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc; (void)argv;
    return cli_error("'tokenize' is not available in this build yet");
}
