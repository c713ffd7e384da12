/* mem_store.h — a rendezvous store (loom_store) in process memory, for tests of one process
 * (world 1): set keeps up to MEM_STORE_KEYS values, get finds the newest under a key and,
 * with nobody else to set it, fails at once with LOOM_ERR_TIMEOUT instead of waiting. */
#ifndef LOOM_TESTS_MEM_STORE_H
#define LOOM_TESTS_MEM_STORE_H

#include <stddef.h>

#include "loom/plugin/comm.h"

enum { MEM_STORE_KEYS = 64, MEM_STORE_VALUE = 256 };

typedef struct mem_store {
    char key[MEM_STORE_KEYS][64];
    unsigned char val[MEM_STORE_KEYS][MEM_STORE_VALUE];
    size_t len[MEM_STORE_KEYS];
    int n;
} mem_store;

/* The loom_store over s, emptied. */
loom_store mem_store_open(mem_store *s);

#endif
