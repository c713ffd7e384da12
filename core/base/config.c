/* config.c — plugin config resolution (see config.h). Defaults are written as a recipe
 * would write them and parsed here: 0.9, true, {0.9, 0.999}, "matrices". */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

const char *loom_cfg_type_name(loom_cfg_type t)
{
    switch (t) {
    case LOOM_CFG_NUMBER: return "number";
    case LOOM_CFG_INTEGER: return "integer";
    case LOOM_CFG_BOOLEAN: return "boolean";
    case LOOM_CFG_STRING: return "string";
    case LOOM_CFG_NUMBERS: return "list of numbers";
    }
    return "?";
}

void loom_config_key_list(const loom_plugin_desc *d, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < d->n_config_keys && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
                                 d->config_keys[i].name);
    if (d->n_config_keys == 0)
        snprintf(buf, len, "none");
}

static const char *kind_of(const loom_plugin_config *c)
{
    const char *k = loom_kind_name(c->desc->kind);
    return k ? k : "plugin";
}

static loom_status parse_default(loom_plugin_config *c, int i, const char *text)
{
    loom_config_value *v = &c->values[i];
    char *end = NULL;
    switch (v->type) {
    case LOOM_CFG_NUMBER:
    case LOOM_CFG_INTEGER:
        v->number = strtod(text, &end);
        if (end == text)
            break;
        return LOOM_OK;
    case LOOM_CFG_BOOLEAN:
        if (strcmp(text, "true") == 0 || strcmp(text, "false") == 0) {
            v->number = text[0] == 't';
            return LOOM_OK;
        }
        break;
    case LOOM_CFG_STRING: {
        size_t n = strlen(text);
        if (n >= 2 && text[0] == '"' && text[n - 1] == '"')
            snprintf(c->strings[i], LOOM_CONFIG_MAX_STRING, "%.*s", (int)(n - 2), text + 1);
        else
            snprintf(c->strings[i], LOOM_CONFIG_MAX_STRING, "%s", text);
        v->string = c->strings[i];
        return LOOM_OK;
    }
    case LOOM_CFG_NUMBERS: {
        const char *p = strchr(text, '{');
        if (!p)
            break;
        p++;
        v->n_numbers = 0;
        while (*p && *p != '}' && v->n_numbers < LOOM_CFG_MAX_NUMBERS) {
            double x = strtod(p, &end);
            if (end == p)
                break;
            v->numbers[v->n_numbers++] = x;
            p = end;
            while (*p == ',' || *p == ' ')
                p++;
        }
        if (*p == '}')
            return LOOM_OK;
        break;
    }
    }
    return loom_fail(LOOM_ERR_PLUGIN, "%s plugin '%s': default '%s' of key '%s' is not a %s",
                     kind_of(c), c->desc->name, text, v->name, loom_cfg_type_name(v->type));
}

loom_status loom_config_init(loom_plugin_config *c, const loom_plugin_desc *d)
{
    memset(c, 0, sizeof *c);
    c->desc = d;
    if (d->n_config_keys > LOOM_CONFIG_MAX_KEYS)
        LOOM_FAIL(LOOM_ERR_PLUGIN, "%s plugin '%s' declares %u config keys (at most %d)",
                  loom_kind_name(d->kind), d->name, d->n_config_keys, LOOM_CONFIG_MAX_KEYS);
    c->count = (int)d->n_config_keys;
    for (int i = 0; i < c->count; i++) {
        const loom_config_key *k = &d->config_keys[i];
        c->values[i].name = k->name;
        c->values[i].type = k->type;
        if (k->default_value)
            LOOM_TRY(parse_default(c, i, k->default_value));
    }
    return LOOM_OK;
}

int loom_config_index(const loom_plugin_config *c, const char *key)
{
    for (int i = 0; i < c->count; i++)
        if (strcmp(c->values[i].name, key) == 0)
            return i;
    char keys[512];
    loom_config_key_list(c->desc, keys, sizeof keys);
    loom_fail(LOOM_ERR_INVALID, "%s '%s' has no key '%s' (accepted: %s)", kind_of(c),
              c->desc->name, key, keys);
    return -1;
}

static loom_status type_error(const loom_plugin_config *c, int i, const char *given)
{
    return loom_fail(LOOM_ERR_INVALID, "%s '%s' key '%s' must be a %s, got %s", kind_of(c),
                     c->desc->name, c->values[i].name, loom_cfg_type_name(c->values[i].type),
                     given);
}

loom_status loom_config_set_number(loom_plugin_config *c, const char *key, double v)
{
    int i = loom_config_index(c, key);
    if (i < 0)
        return LOOM_ERR_INVALID;
    loom_cfg_type t = c->values[i].type;
    if (t == LOOM_CFG_NUMBERS)
        return loom_config_set_numbers(c, key, &v, 1);
    if (t != LOOM_CFG_NUMBER && t != LOOM_CFG_INTEGER)
        return type_error(c, i, "a number");
    if (t == LOOM_CFG_INTEGER && v != floor(v)) {
        char given[64];
        snprintf(given, sizeof given, "%g", v);
        return type_error(c, i, given);
    }
    c->values[i].number = v;
    c->is_set[i] = 1;
    return LOOM_OK;
}

loom_status loom_config_set_boolean(loom_plugin_config *c, const char *key, int v)
{
    int i = loom_config_index(c, key);
    if (i < 0)
        return LOOM_ERR_INVALID;
    if (c->values[i].type != LOOM_CFG_BOOLEAN)
        return type_error(c, i, v ? "true" : "false");
    c->values[i].number = v != 0;
    c->is_set[i] = 1;
    return LOOM_OK;
}

loom_status loom_config_set_string(loom_plugin_config *c, const char *key, const char *v)
{
    int i = loom_config_index(c, key);
    if (i < 0)
        return LOOM_ERR_INVALID;
    if (c->values[i].type != LOOM_CFG_STRING) {
        char given[300];
        snprintf(given, sizeof given, "\"%s\"", v);
        return type_error(c, i, given);
    }
    if (strlen(v) >= LOOM_CONFIG_MAX_STRING)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s '%s' key '%s': value longer than %d characters",
                  kind_of(c), c->desc->name, key, LOOM_CONFIG_MAX_STRING - 1);
    snprintf(c->strings[i], LOOM_CONFIG_MAX_STRING, "%s", v);
    c->values[i].string = c->strings[i];
    c->is_set[i] = 1;
    return LOOM_OK;
}

loom_status loom_config_set_numbers(loom_plugin_config *c, const char *key, const double *v, int n)
{
    int i = loom_config_index(c, key);
    if (i < 0)
        return LOOM_ERR_INVALID;
    if (c->values[i].type != LOOM_CFG_NUMBERS)
        return type_error(c, i, "a list");
    if (n > LOOM_CFG_MAX_NUMBERS)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s '%s' key '%s': %d numbers given (at most %d)",
                  kind_of(c), c->desc->name, key, n, LOOM_CFG_MAX_NUMBERS);
    memcpy(c->values[i].numbers, v, (size_t)n * sizeof *v);
    c->values[i].n_numbers = n;
    c->is_set[i] = 1;
    return LOOM_OK;
}

loom_status loom_config_finish(const loom_plugin_config *c)
{
    for (int i = 0; i < c->count; i++)
        if (!c->desc->config_keys[i].default_value && !c->is_set[i])
            LOOM_FAIL(LOOM_ERR_INVALID, "%s '%s' needs key '%s' (%s: %s)", kind_of(c),
                      c->desc->name, c->values[i].name, loom_cfg_type_name(c->values[i].type),
                      c->desc->config_keys[i].help);
    return LOOM_OK;
}

void loom_config_copy(loom_plugin_config *dst, const loom_plugin_config *src)
{
    memcpy(dst, src, sizeof *dst);
    for (int i = 0; i < dst->count; i++)
        if (dst->values[i].string)
            dst->values[i].string = dst->strings[i];
}

loom_config loom_config_view(const loom_plugin_config *c)
{
    loom_config v = {c->count, c->values};
    return v;
}

const loom_config_value *loom_config_get(const loom_plugin_config *c, const char *key)
{
    for (int i = 0; i < c->count; i++)
        if (strcmp(c->values[i].name, key) == 0)
            return &c->values[i];
    return NULL;
}
