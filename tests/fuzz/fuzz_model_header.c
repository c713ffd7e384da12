/* fuzz_model_header.c — libFuzzer target: an llm.c model file's header as
 * loom_llmc_read_config reads it (magic, version, shape fields, size against the file),
 * the input written to a file first. Any input must give a shape or a named refusal. */
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "io/llmc_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/loom-fuzz-model-%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    loom_gpt_config cfg;
    (void)loom_llmc_read_config(path, &cfg);
    unlink(path);
    return 0;
}
