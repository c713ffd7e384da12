/* mem_store.c — see mem_store.h. */
#include "mem_store.h"

#include <stdio.h>
#include <string.h>

#include "base/status.h"

static loom_status ms_set(void *self, const char *key, const void *value, size_t len)
{
    mem_store *s = self;
    if (s->n >= MEM_STORE_KEYS || len > MEM_STORE_VALUE || strlen(key) >= sizeof s->key[0])
        return loom_fail(LOOM_ERR_INVALID, "test store: full or too long (%s, %zu bytes)", key,
                         len);
    snprintf(s->key[s->n], sizeof s->key[0], "%s", key);
    memcpy(s->val[s->n], value, len);
    s->len[s->n++] = len;
    return LOOM_OK;
}

static loom_status ms_get(void *self, const char *key, void *value, size_t *len, int timeout_ms)
{
    (void)timeout_ms;
    mem_store *s = self;
    for (int i = s->n - 1; i >= 0; i--)
        if (strcmp(s->key[i], key) == 0) {
            if (*len < s->len[i])
                return loom_fail(LOOM_ERR_INVALID, "test store: %s holds %zu bytes, room for %zu",
                                 key, s->len[i], *len);
            memcpy(value, s->val[i], s->len[i]);
            *len = s->len[i];
            return LOOM_OK;
        }
    return loom_fail(LOOM_ERR_TIMEOUT, "test store: no key %s (one process: nobody will set it)",
                     key);
}

loom_store mem_store_open(mem_store *s)
{
    memset(s, 0, sizeof *s);
    return (loom_store){.self = s, .set = ms_set, .get = ms_get};
}
