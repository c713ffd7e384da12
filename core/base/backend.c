/* backend.c — loading a kernel backend through the plugin loader. */
#include "backend.h"

#include <stddef.h>
#include <string.h>

#include "config.h"
#include "plugin_loader.h"
#include "status.h"

loom_status loom_backend_open(const char *name, int threads, loom_backend *out)
{
    memset(out, 0, sizeof *out);
    const loom_plugin *p;
    LOOM_TRY(loom_plugin_load(LOOM_KIND_BACKEND, name, &p));
    if (p->desc->probe) {
        char reason[256] = "";
        if (!p->desc->probe(reason, sizeof reason))
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "backend '%s' is not usable here: %s", name, reason);
    }
    loom_plugin_config cfg;
    LOOM_TRY(loom_config_init(&cfg, p->desc));
    if (loom_config_index(&cfg, "threads") >= 0)
        LOOM_TRY(loom_config_set_number(&cfg, "threads", threads));
    loom_config view = loom_config_view(&cfg);
    out->ops = p->desc->ops;
    LOOM_TRY(out->ops->create(loom_core_host(), &view, &out->self));
    return LOOM_OK;
}

void loom_backend_close(loom_backend *b)
{
    if (b->ops && b->self)
        b->ops->destroy(b->self);
    memset(b, 0, sizeof *b);
}

int loom_backend_device_memory(const loom_backend *b)
{
    return b->ops && b->ops->size > offsetof(loom_backend_ops, stream) && b->ops->stream &&
           b->ops->stream(b->self) != NULL;
}

void loom_backend_copy_bits(const loom_backend *b, float *dst, const float *src, size_t n)
{
    if (!loom_backend_device_memory(b)) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    b->ops->zero(b->self, dst, n * sizeof(float));
    b->ops->scale(dst, -1.0f, n);
    b->ops->accumulate(dst, src, n);
}
