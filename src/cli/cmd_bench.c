/* cmd_bench.c — placeholder until the 'bench' command lands (the command reports that it is unavailable). */
#include "cli.h"

int cmd_bench(int argc, char **argv) {
    (void)argc; (void)argv;
    return cli_error("'bench' is not available in this build yet");
}
