/* plugin_test_util.c — see plugin_test_util.h. Test-only code: failures are reported by
 * return value and the caller asserts. */
#include "plugin_test_util.h"

#include <dirent.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef LOOM_TEST_BUILD_PLUGIN_DIRS
#error "LOOM_TEST_BUILD_PLUGIN_DIRS must be defined by the build"
#endif

static const char *skip_ws(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    return s;
}

static int parse_number(const char *s, double *out, const char **end)
{
    char *e;
    *out = strtod(s, &e);
    if (e == s)
        return 0;
    *end = e;
    return 1;
}

int tcfg_parse_value(const char *text, loom_config_value *v, char *strbuf, size_t strcap)
{
    const char *s = skip_ws(text), *e;
    switch (v->type) {
    case LOOM_CFG_NUMBER:
    case LOOM_CFG_INTEGER:
        if (!parse_number(s, &v->number, &e) || *skip_ws(e) != '\0')
            return 0;
        return v->type == LOOM_CFG_NUMBER || v->number == (double)(long long)v->number;
    case LOOM_CFG_BOOLEAN:
        if (strcmp(s, "true") == 0)
            v->number = 1;
        else if (strcmp(s, "false") == 0)
            v->number = 0;
        else
            return 0;
        return 1;
    case LOOM_CFG_STRING: {
        size_t len = strlen(s);
        if (len < 2 || s[0] != '"' || s[len - 1] != '"' || len - 2 >= strcap)
            return 0;
        memcpy(strbuf, s + 1, len - 2);
        strbuf[len - 2] = '\0';
        v->string = strbuf;
        return 1;
    }
    case LOOM_CFG_NUMBERS:
        if (*s != '{')
            return 0;
        s = skip_ws(s + 1);
        v->n_numbers = 0;
        while (*s != '}') {
            if (v->n_numbers == LOOM_CFG_MAX_NUMBERS || !parse_number(s, &v->numbers[v->n_numbers], &e))
                return 0;
            v->n_numbers++;
            s = skip_ws(e);
            if (*s == ',')
                s = skip_ws(s + 1);
            else if (*s != '}')
                return 0;
        }
        return *skip_ws(s + 1) == '\0';
    }
    return 0;
}

static const char *find_override(const char *const *ov, const char *name)
{
    size_t len = strlen(name);
    for (; ov != NULL && *ov != NULL; ov++)
        if (strncmp(*ov, name, len) == 0 && (*ov)[len] == '=')
            return *ov + len + 1;
    return NULL;
}

int tcfg_build(tcfg *t, const loom_plugin_desc *d, const char *const *overrides,
               int fill_required)
{
    memset(t, 0, sizeof *t);
    if (d->n_config_keys > TCFG_MAX) {
        snprintf(t->err, sizeof t->err, "%u keys, the test helper holds %d", d->n_config_keys,
                 TCFG_MAX);
        return 0;
    }
    for (uint32_t i = 0; i < d->n_config_keys; i++) {
        const loom_config_key *k = &d->config_keys[i];
        loom_config_value *v = &t->vals[i];
        v->name = k->name;
        v->type = k->type;
        const char *text = find_override(overrides, k->name);
        if (text == NULL)
            text = k->default_value;
        if (text == NULL && fill_required)
            text = k->type == LOOM_CFG_NUMBERS ? "{0.001}"
                 : k->type == LOOM_CFG_STRING  ? "\"x\""
                 : k->type == LOOM_CFG_BOOLEAN ? "false"
                                               : "0.001";
        if (text == NULL) {
            snprintf(t->err, sizeof t->err, "key '%s' is required and has no value", k->name);
            return 0;
        }
        if (!tcfg_parse_value(text, v, t->strs[i], TCFG_STR)) {
            snprintf(t->err, sizeof t->err, "key '%s': cannot read '%s' as its type %d", k->name,
                     text, (int)k->type);
            return 0;
        }
    }
    t->cfg.count = (int)d->n_config_keys;
    t->cfg.values = t->vals;
    return 1;
}

int test_build_plugin_dirs(char dirs[][1024], int cap)
{
    const char *p = LOOM_TEST_BUILD_PLUGIN_DIRS;
    int n = 0;
    while (*p != '\0' && n < cap) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        if (len > 0 && len < 1024) {
            memcpy(dirs[n], p, len);
            dirs[n++][len] = '\0';
        }
        if (colon == NULL)
            break;
        p = colon + 1;
    }
    return n;
}

int test_each_built_plugin(const char *prefix, void (*visit)(const char *path, void *ctx),
                           void *ctx)
{
    char dirs[32][1024];
    int nd = test_build_plugin_dirs(dirs, 32), n = 0;
    size_t plen = strlen(prefix);
    for (int i = 0; i < nd; i++) {
        DIR *d = opendir(dirs[i]);
        if (d == NULL)
            continue;
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            size_t len = strlen(de->d_name);
            if (strncmp(de->d_name, prefix, plen) != 0 || len < plen + 3 ||
                strcmp(de->d_name + len - 3, ".so") != 0)
                continue;
            char path[2048];
            int w = snprintf(path, sizeof path, "%s/%s", dirs[i], de->d_name);
            if (w < 0 || (size_t)w >= sizeof path)
                continue;
            visit(path, ctx);
            n++;
        }
        closedir(d);
    }
    return n;
}

const char *test_build_plugin_path(const char *kind, const char *name)
{
    static char path[2048];
    char dirs[32][1024];
    int n = test_build_plugin_dirs(dirs, 32);
    for (int i = 0; i < n; i++) {
        struct stat st;
        int len = snprintf(path, sizeof path, "%s/loom-%s-%s.so", dirs[i], kind, name);
        if (len > 0 && (size_t)len < sizeof path && stat(path, &st) == 0)
            return path;
    }
    return NULL;
}

int test_copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    int rc = (in && out) ? 0 : -1;
    char buf[1 << 16];
    size_t n;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n)
            rc = -1;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        rc = -1;
    return rc;
}
