/* checkpoint.h — saving and exactly resuming a run: parameters, optimizer state, step
 * count, precision state, data position and the recipe's resolved configuration.
 *
 * Layout of one checkpoint, dir/step_%08lld/:
 *   model.safetensors  every parameter, named as the parameter table names it, F32, the
 *                      slice this rank holds; __metadata__ has, per tensor, its logical
 *                      shape and slice start as JSON text ({"shape":[..],"slice_start":[..]})
 *   optim.safetensors  slot k of parameter X as "X.state<k>" (X's held shape), same metadata
 *   manifest.json      format "loom-checkpoint", version 1, loom version, step, steps_taken,
 *                      precision state, optimizer {name, slots}, model config, data
 *                      {kind, state}, files {name: {bytes, xxh64}}, the config verbatim,
 *                      and last its own checksum
 * plus dir/latest, a one-line file naming the newest checkpoint directory ("step_00000020").
 *
 * Checksums are XXH64 with seed 0 (checksum.h; what `xxhsum -H1` prints) of every byte, as
 * 16 lowercase hex digits. The manifest's "checksum" member is "xxh64:<hex>" over the
 * manifest's own text with those 16 digits written as '0'; so every byte of all three
 * files is covered.
 *
 * Crash safety: a save writes into dir/.tmp-step_N.<pid>/, fsyncs each file and the
 * directory, renames it to step_N (fsync dir), and only then replaces `latest` (temp file,
 * fsync, rename, fsync dir). A crash at any moment leaves the previous checkpoint intact
 * and selected. Saving a step that exists replaces it: the new directory is swapped in
 * atomically (renameat2 RENAME_EXCHANGE; where the filesystem lacks it, the old one is
 * renamed aside to .tmp-... first) and the old one is then deleted. Retention renames a
 * checkpoint to .tmp-del-... before deleting its files. So every step_* directory is
 * complete unless the disk lost data; find() skips one that is not, and nothing deletes
 * it (a damaged checkpoint is left for a person to look at).
 *
 * Multi-rank: today every rank holds the full model, so exactly one rank (rank 0) saves;
 * per-rank shards will add rank-suffixed files next to these.
 * Host memory: the session's buffers are read and written directly (the CPU backend).
 */
#ifndef LOOM_CORE_CHECKPOINT_H
#define LOOM_CORE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "session.h"

#define LOOM_CHECKPOINT_FORMAT "loom-checkpoint"
#define LOOM_CHECKPOINT_VERSION 1
#define LOOM_CHECKPOINT_KIND_MAX 32

typedef struct loom_checkpoint_extra {
    int64_t step;             /* the recipe's step number (>= 0) */
    /* save: the resolved recipe configuration, a JSON object (or NULL: saved as null);
     * load: a malloc'd copy of what was saved, or NULL; release with
     * loom_checkpoint_extra_free */
    const char *config_json;
    char data_kind[LOOM_CHECKPOINT_KIND_MAX]; /* "": no data position */
    uint64_t data_state[LOOM_DATA_STATE_MAX];
    int n_data_state;
    int keep;                 /* save: keep the newest `keep` checkpoints (0: keep all) */
} loom_checkpoint_extra;

/* Save s into dir/step_%08lld (dir is created if missing), point dir/latest at it, apply
 * retention (extra->keep) and remove stale .tmp-* entries of crashed saves. The path of
 * the new checkpoint goes to out_path (may be NULL). On failure the directory is as it
 * was, but for a leftover .tmp-* that the next save removes. Retention is best effort:
 * a checkpoint that cannot be deleted stays, and the save still succeeds. */
loom_status loom_checkpoint_save(loom_session *s, const char *dir, const loom_checkpoint_extra *extra,
                                 char *out_path, size_t len);

/* The checkpoint to resume from: the one `latest` names if it is complete (manifest
 * intact, files present with the recorded sizes), else the newest complete step_*.
 * LOOM_ERR_IO with a message when there is none. */
loom_status loom_checkpoint_find(const char *dir, char *out, size_t len);

/* Validate the checkpoint at ckpt_path completely (manifest, checksums, every tensor's
 * name, dtype and shape against this session's parameter table, optimizer and model
 * config) and only then copy it into s. On failure s is unchanged and the message names
 * the file and field. out gets step, config_json (caller frees via
 * loom_checkpoint_extra_free) and the data position; out may be NULL and is untouched
 * on failure. */
loom_status loom_checkpoint_load(loom_session *s, const char *ckpt_path, loom_checkpoint_extra *out);
/* The same, also restoring data's reading position (data may be NULL). The data kind is
 * checked with everything else; if data or the session cannot take the state, neither
 * is changed. */
loom_status loom_checkpoint_load_data(loom_session *s, const char *ckpt_path, loom_data *data,
                                      loom_checkpoint_extra *out);
void loom_checkpoint_extra_free(loom_checkpoint_extra *e);

/* --- shared by checkpoint.c and checkpoint_load.c ------------------------------------- */

#define LOOM_CKPT_MODEL_FILE "model.safetensors"
#define LOOM_CKPT_OPTIM_FILE "optim.safetensors"
#define LOOM_CKPT_MANIFEST_FILE "manifest.json"

struct loom_json_doc;
/* Read a whole file (NUL-terminated, at most max bytes). LOOM_ERR_IO names the path. */
loom_status loom_ckpt_read_file(const char *path, size_t max, unsigned char **bytes, size_t *size);
/* Read ckpt_dir/manifest.json, parse it, check its own checksum, format and version. */
loom_status loom_ckpt_manifest_open(const char *ckpt_dir, struct loom_json_doc **doc, char **text);
/* Manifest intact and its files present with the recorded sizes (no data checksums). */
int loom_ckpt_is_complete(const char *ckpt_dir);

#endif
