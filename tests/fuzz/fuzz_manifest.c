/* fuzz_manifest.c — libFuzzer target: a checkpoint manifest. The input becomes
 * manifest.json of a checkpoint directory whose tensor files are a real tiny checkpoint's
 * (LOOM_FUZZ_CKPT, made by scripts/fuzz); a "checksum":"xxh64:<16 hex>" in it is rewritten
 * to the text's real checksum first, so the fuzzer gets past that gate to the manifest's
 * meaning (format, version, files, sizes, layout). Then loom_ckpt_is_complete and
 * loom_ckpt_verify judge it: any input must be accepted or refused, never crash. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/checksum.h"
#include "train/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[256];

static void setup(void)
{
    if (dir[0])
        return;
    const char *src = getenv("LOOM_FUZZ_CKPT");
    snprintf(dir, sizeof dir, "/tmp/loom-fuzz-manifest-%d", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp '%s'/*.safetensors '%s'/", dir,
             dir, src ? src : "/nonexistent", dir);
    if (!src || system(cmd) != 0) {
        fprintf(stderr, "fuzz_manifest: set LOOM_FUZZ_CKPT to a checkpoint directory\n");
        exit(2);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    /* Make a well-formed checksum field hold the true checksum (as a save writes it). */
    static const char key[] = "\"checksum\":\"xxh64:";
    char *at = size < 1 << 20 ? strstr(text, key) : NULL;
    if (at && (size_t)(at - text) + sizeof key - 1 + 16 <= size) {
        char *digits = at + sizeof key - 1;
        memset(digits, '0', 16);
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, loom_xxh64(text, size));
        memcpy(digits, hex, 16);
    }
    char path[300];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(text, 1, size, f);
        fclose(f);
        (void)loom_ckpt_is_complete(dir);
        uint64_t bytes = 0;
        (void)loom_ckpt_verify(dir, &bytes);
    }
    free(text);
    return 0;
}
