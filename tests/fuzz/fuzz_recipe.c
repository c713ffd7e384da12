/* fuzz_recipe.c — libFuzzer target: recipe loading through the real program. cli.c is
 * compiled into this target with its main renamed; each input is written to a file and
 * `loom run recipe_driver.lua` runs it (see recipe_driver.lua: the input is the table a
 * recipe gives loom.train). A refusal is a "loom: ..." message and exit status 1; a crash,
 * a sanitizer report or a leak is a finding. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int loom_cli_main(int argc, char **argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char input[64];
    const char *driver = getenv("LOOM_FUZZ_DRIVER");
    if (!driver)
        return 0;
    if (!input[0]) {
        snprintf(input, sizeof input, "/tmp/loom-fuzz-recipe-%d.lua", (int)getpid());
        setenv("LOOM_FUZZ_INPUT", input, 1);
    }
    FILE *f = fopen(input, "wb");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    char *argv[] = {"loom", "run", (char *)driver, NULL};
    (void)loom_cli_main(3, argv);
    return 0;
}
