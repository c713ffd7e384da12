/* fuzz_headers.c — libFuzzer target: an llm.c token shard as loom opens it from disk
 * (loom_data_open_shards: magic, version, token count against the file size), each input
 * written to a file first. Any input must open or be refused by name, never crash (ASan +
 * UBSan). The llm.c model header is not covered yet (llmc_model.c links the model room). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/data_shards.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char path[64];
    snprintf(path, sizeof path, "/tmp/loom-fuzz-%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data + 1, 1, size - 1, f);
    fclose(f);
    loom_data d;
    if (loom_data_open_shards(path, NULL, data[0] & 1, 1, &d) == LOOM_OK)
        loom_data_close(&d);
    unlink(path);
    return 0;
}
