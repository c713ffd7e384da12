/* checkpoint.h — saving and exactly resuming a run: parameters, optimizer state, step
 * count, precision state, data position and the recipe's resolved configuration.
 *
 * Layout of one checkpoint, dir/step_%08lld/, saved at tensor-parallel degree tp = N:
 *   N = 1: model.safetensors, optim.safetensors, manifest.json
 *   N > 1: model.tp<r>.safetensors and optim.tp<r>.safetensors for r = 0..N-1 (what tp
 *          rank r holds), manifest.json
 *   pipeline parallelism (pp = P > 1): the same per stage s = 0..P-1, with ".pp<s>" before
 *          the tp part (model.pp<s>.safetensors, or model.pp<s>.tp<r>.safetensors): what
 *          stage s holds, except that the tied wte, held by the first and the last stage
 *          (bitwise-identical copies), is written once, by stage 0.
 *   model*.safetensors  every parameter, named as the parameter table names it, F32, the
 *                      slice the writing rank holds; __metadata__ has, per tensor, its
 *                      logical shape and slice start as JSON text
 *                      ({"shape":[..],"slice_start":[..]}); the slice length is the
 *                      stored tensor's shape. Replicated parameters appear in every file.
 *                      __metadata__ also has "loom.tiles": the XXH64 of every tile of
 *                      every tensor (loom_ckpt_tiling below), 16 hex digits each.
 *   optim*.safetensors slot k of parameter X as "X.state<k>" (X's held shape), same metadata
 *   residual*.safetensors  with gradient compression only (compress.h): every dp rank's
 *                      error-feedback residual, dp rank k's of parameter X as "X.state<k>",
 *                      one file per tp x pp part as above; the manifest then has
 *                      "compress": {"method": M, "dp": N}, and a resume needs the same dp.
 *                      Canonical mode: one residual per global micro-batch of a step
 *                      (slot k = micro-batch k), "dp": the micro-batches a step and
 *                      "leaves": true; a resume needs the same count, at any dp
 *                      Under ep (fast mode): every expert by logical name, slot k dp rank
 *                      k's when it holds the expert, else 0, and "ep": N; a resume needs
 *                      the same dp and ep (compress_ckpt.h)
 *   manifest.json      format "loom-checkpoint", version 1, loom version, step, steps_taken,
 *                      precision state, optimizer {name, slots}, model config, layout
 *                      {tp: N} (under pp also pp: P and pp_layers: the blocks of each
 *                      virtual stage, stage-major), data {kind, state}, files {name:
 *                      {bytes, xxh64, header_xxh64}} (every file above), the config
 *                      verbatim, and last its own checksum. A manifest without "layout" is tp = 1, without
 *                      "pp" pp = 1.
 * plus dir/latest, a one-line file naming the newest checkpoint directory ("step_00000020").
 *
 * Checksums are XXH64 with seed 0 (checksum.h; what `xxhsum -H1` prints) of every byte, as
 * 16 lowercase hex digits. The manifest's "checksum" member is "xxh64:<hex>" over the
 * manifest's own text with those 16 digits written as '0'; so every byte of every file
 * is covered.
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
 * Multi-rank (mesh pp x dp x tp, see loom_host.group): save is collective over the world.
 * The ranks of dp rank 0 (one whole tp group per pipeline stage) write (with slice files,
 * below, every dp rank writes its own; dp rank 0 broadcasts the temporary directory over dp
 * and gathers the dp group's reports before the tp and pp gathers): the writer of
 * stage 0 and tp rank 0 makes the temp directory and broadcasts its name (its pid) over
 * its pp group, then every stage's tp rank 0 over its tp group; every writer writes its
 * two files into it, each tp group gathers its ranks' outcomes (sizes, checksums or the
 * error), the stages' tp ranks 0 gather those over their pp group, and stage 0's tp rank
 * 0 writes the manifest (last), installs the directory, updates `latest` and applies
 * retention. Then every rank of the world exchanges its outcome, so all return together
 * and all fail if one did (the failing rank's message says why; the others name it).
 * A rank that fails locally still takes part in every exchange, so no rank waits for one
 * that gave up; a dead rank shows as the communicator's timeout.
 * Load is local: every rank reads the manifest and the header of every tensor file
 * (checked against the manifest's "header_xxh64"), then only the byte ranges of the
 * tensors and slices it holds, in whole tiles (about 16 KiB) each checked against the
 * header's "loom.tiles" (a checkpoint without header_xxh64, from before, is read whole and
 * checked against the file's xxh64), and assembles the slice it holds of every parameter
 * and optimizer slot from the stored pieces that overlap it ("remap through logical names and slices"): any saved
 * tp degree loads at any other (tp=2 -> 1, 2, 4; 1 -> 2, 4), any pp layout at any other
 * (a pipeline stage takes the tensors it holds and skips those another stage holds:
 * loom_gpt_held_elsewhere), and `loom export` (a tp=1 session) reads a tp > 1 or pp > 1
 * checkpoint. Pieces with the same box are replicas (the one in
 * the lowest-numbered file is used); pieces whose boxes overlap otherwise, a logical
 * shape other than this run's, or pieces that leave part of a held slice uncovered are
 * refused, naming the file and tensor.
 * Host memory: the session's buffers are read and written directly (the CPU backend).
 */
#ifndef LOOM_CORE_CHECKPOINT_H
#define LOOM_CORE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "io/data.h"
#include "model/gpt.h"
#include "model/params.h"
#include "session.h"
#include "zero_ckpt.h"

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
    char protect[64];         /* save: a step_* name retention never deletes ("": none) — the
                               * last good checkpoint before a run of skipped steps */
} loom_checkpoint_extra;

/* Save s into dir/step_%08lld (dir is created if missing), point dir/latest at it, apply
 * retention (extra->keep) and remove stale .tmp-* entries of crashed saves. The path of
 * the new checkpoint goes to out_path (may be NULL). On failure the directory is as it
 * was, but for a leftover .tmp-* that the next save removes. Retention is best effort:
 * a checkpoint that cannot be deleted stays, and the save still succeeds.
 * Collective: every rank of the world calls it with its own session and the same dir and
 * extra (see "Multi-rank" above); it returns on all ranks once the checkpoint is in place
 * (or has failed everywhere). */
loom_status loom_checkpoint_save(loom_session *s, const char *dir, const loom_checkpoint_extra *extra,
                                 char *out_path, size_t len);

/* The checkpoint to resume from: the one `latest` names if it is complete (manifest
 * intact, files present with the recorded sizes), else the newest complete step_*.
 * LOOM_ERR_IO with a message when there is none. */
loom_status loom_checkpoint_find(const char *dir, char *out, size_t len);

/* Validate the checkpoint at ckpt_path completely (manifest, checksums, every tensor's
 * name, dtype, logical shape and slice against this session's parameter table, optimizer
 * and model config) and only then copy it into s, resharding as needed. Every rank calls
 * it (no communication: each reads what it needs). On failure s is unchanged and the message names
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
#define LOOM_CKPT_TP_MAX 4096
/* About how many bytes one recorded checksum covers (the header's "loom.tiles"): a load
 * reads and checks whole tiles of what it needs. */
#define LOOM_CKPT_TILE_BYTES 16384

/* How a stored tensor is cut into checksummed tiles. Viewed as R rows of its last dim K
 * (R = the product of the other dims), a tile is `rows` consecutive rows by `cols`
 * consecutive columns (the last ones narrower): a row of more than LOOM_CKPT_TILE_BYTES
 * is halved until a piece fits (rows = 1); a shorter row is cut in 8 when K divides by 8
 * (so tp <= 8 column splits read only their columns) and `rows` of those fill about
 * LOOM_CKPT_TILE_BYTES. Tiles go row block by row block, column block by column block;
 * the header lists the tensors' tiles in file order, 16 hex digits of XXH64 each, the
 * hash of a tile being that of its rows' pieces in order. */
typedef struct loom_ckpt_tiling {
    uint64_t R, K, rows, cols;
    uint64_t row_blocks, col_blocks; /* n = row_blocks * col_blocks tiles; 0 if empty */
} loom_ckpt_tiling;
loom_ckpt_tiling loom_ckpt_tiling_of(int ndim, const int64_t *shape, uint64_t elem_size);

/* The XXH64 of a safetensors file's first 8 + N bytes (length and header); header_bytes
 * (may be NULL) gets 8 + N. LOOM_ERR_IO / LOOM_ERR_CORRUPT naming the path. */
loom_status loom_ckpt_header_sum(const char *path, uint64_t *sum, uint64_t *header_bytes);
/* Bytes the calling thread's latest load read from tensor files, and their total size (a
 * load that reads only the ranges it holds shows it here; LOOM_CKPT_STATS=1 in the
 * environment also prints both to stderr after every load). */
void loom_ckpt_read_stats(uint64_t *read, uint64_t *total);
/* Check every byte of the checkpoint at ckpt_dir: the manifest, and each tensor file's
 * size, XXH64, header checksum and tile checksums, and that it parses. bytes (may
 * be NULL) gets the total checked. The message names the first bad file and why. */
loom_status loom_ckpt_verify(const char *ckpt_dir, uint64_t *bytes);

/* The tensor file of kind "model" or "optim" written by part `part` of a tp x pp layout
 * (part = stage * tp + tp rank): "model.safetensors" when tp == pp == 1, else
 * "model.tp<r>.safetensors" (pp == 1), "model.pp<s>.safetensors" (tp == 1) or
 * "model.pp<s>.tp<r>.safetensors". */
void loom_ckpt_file_name(char *out, size_t len, const char *kind, int part, int tp, int pp);

/* Slice files (ZeRO, docs/ZERO.md "Checkpoints"): under zero = 1..3 with dp = N > 1 every dp
 * rank d writes its own partition of the optimizer state as optim<part>.dp<d>.safetensors
 * ("optim.dp1.safetensors", "optim.pp0.tp1.dp1.safetensors"), and under zero = 3 its
 * partition of the parameters as model<part>.dp<d>.safetensors; the parameters under zero =
 * 1, 2 are whole on every dp rank and written by dp rank 0 as without ZeRO. A partition
 * piece (a flat range of one parameter's held slice) is stored as the boxes that tile it,
 * each a tensor "<name>#<first element>" (optimizer: "<name>.state<k>#<first>") with the
 * usual logical shape, slice start and tile checksums, so the loader assembles any layout
 * from them as from tp slices. The manifest's layout then has "slices": ["optim"] or
 * ["model", "optim"] beside "zero" and "dp". A layout's files of each kind: */
typedef struct loom_ckpt_layout {
    int tp, pp, dp;
    unsigned char sliced[3]; /* model, optim, residual: one file per dp rank */
} loom_ckpt_layout;
/* How many files of kind (0 model, 1 optim, 2 residual), and the i-th one's name (part =
 * i / per, dp rank = i % per, per = dp when the kind is sliced, else 1). */
int loom_ckpt_kind_count(const loom_ckpt_layout *l, int kind);
void loom_ckpt_kind_name(char *out, size_t len, const loom_ckpt_layout *l, int kind, int i);

/* One box of a flat range of a row-major tensor: start and length per dim, and where its
 * first element sits in the range. loom_ckpt_range_boxes tiles elements [a, b) of a tensor
 * of shape s (nd dims) with boxes, in order: at each point the coarsest dim the range is
 * aligned to and still covers, as many of its rows as fit; returns how many (at most
 * 2 x nd). Slice files store a partition piece so; a ZeRO load marks the tiles it reads so. */
typedef struct loom_ckpt_box {
    int64_t start[LOOM_PARAM_MAX_DIMS], len[LOOM_PARAM_MAX_DIMS];
    uint64_t at;
} loom_ckpt_box;
int loom_ckpt_range_boxes(const int64_t *s, int nd, uint64_t a, uint64_t b, loom_ckpt_box *out);

struct loom_st_tensor;
/* Write tensors ts[0..n) to path with meta[0..n_meta) plus the header's "loom.tiles" (the
 * XXH64 of every tile; meta must have room for one more entry), then the header's own sum
 * (*head): the one writer of model, optim and slice files. *bytes, *sum as
 * loom_safetensors_write gives them. */
struct loom_st_meta;
loom_status loom_ckpt_write_tiled(const char *path, const struct loom_st_tensor *ts, int n,
                                  struct loom_st_meta *meta, int n_meta, uint64_t *bytes,
                                  uint64_t *sum, uint64_t *head);
/* One dp rank's slice file: the pieces p[0..n_pieces) of its partition `part` (the
 * parameters, or slots-major state when is_optim) as boxes, entry `skip` left out. */
loom_status loom_ckpt_write_slices(const char *path, const loom_param_table *t,
                                   const loom_zero_piece *p, size_t n_pieces, const float *part,
                                   uint32_t slots, int is_optim, const char *optim_name,
                                   const char *skip, uint64_t *bytes, uint64_t *sum, uint64_t *head);

struct loom_json_doc;
/* Read a whole file (NUL-terminated, at most max bytes). LOOM_ERR_IO names the path. */
loom_status loom_ckpt_read_file(const char *path, size_t max, unsigned char **bytes, size_t *size);
/* Read ckpt_dir/manifest.json, parse it, check its own checksum, format and version. */
loom_status loom_ckpt_manifest_open(const char *ckpt_dir, struct loom_json_doc **doc, char **text);
/* Manifest intact and its files present with the recorded sizes (no data checksums). */
int loom_ckpt_is_complete(const char *ckpt_dir);

/* --- the pieces of a save, below the session (unit tests drive these directly) ------- */

/* One rank's view of a mesh group: ops/comm NULL for a group of one. */
typedef struct loom_ckpt_group {
    const struct loom_comm_ops *ops;
    void *comm;
    int size, rank;
} loom_ckpt_group;

typedef struct loom_ckpt_groups {
    loom_ckpt_group world, dp, tp;
    loom_ckpt_group pp;          /* size 0 or 1: no pipeline */
} loom_ckpt_groups;

/* Everything a save writes, as one rank holds it. */
typedef struct loom_ckpt_source {
    const loom_param_table *table;
    const float *params;         /* table->total floats */
    const float *state;          /* slots * table->total floats (slot-major per entry) */
    uint32_t slots;
    const char *optim_name;
    loom_gpt_config model;
    loom_session_state state_info;
    /* pipeline parallelism (groups.pp.size > 1): an entry this stage leaves out (the tied
     * wte on the last stage; NULL: none) and the split for the manifest, pp_first[0..n]
     * with virtual stage k holding blocks [pp_first[k], pp_first[k+1]) */
    const char *skip;
    const int *pp_first;
    int pp_virtual;
    /* ZeRO (0: none): the stage and dp size the run saved under, for the manifest */
    int zero_stage, zero_dp;
    /* ZeRO slice files (above; pieces NULL: none): this dp rank's partition pieces
     * (zero_ckpt.h), its state partition (state above unused) and under stage 3 its
     * parameter partition (params above unused but by nothing; NULL below stage 3) */
    const loom_zero_piece *pieces;
    size_t n_pieces;
    const float *part_state, *part_params;
    /* gradient compression (compress.h; NULL: none): every dp rank's error-feedback
     * residual, slot k = dp rank k, laid out as the state above (slot-major per entry),
     * written as residual*.safetensors ("X.state<k>") and named in the manifest's
     * "compress": {"method", "dp"[, "ep"]}; residual_leaves: slot k = global micro-batch k */
    const float *residual;
    uint32_t residual_slots;
    int residual_leaves;   /* canonical compression: the slots are global micro-batches */
    int residual_ep;       /* > 1: saved under expert parallelism ("ep" in the manifest's
                            * "compress"): an expert's slot k is dp rank k's residual if that
                            * rank holds the expert, else 0 (compress_ckpt.h) */
    const char *compress_method;
} loom_ckpt_source;

/* loom_checkpoint_save with the source and the groups given (the session version takes
 * them from the session and loom_core_host()->group). */
loom_status loom_ckpt_save_source(const loom_ckpt_source *src, const loom_ckpt_groups *g,
                                  const char *dir, const loom_checkpoint_extra *extra,
                                  char *out_path, size_t len);

/* Validate the tensor files of the checkpoint at ckpt_dir (manifest, layout, checksums,
 * every piece against table t with `slots` optimizer slots) and then assemble the held
 * slices into params (t->total floats) and state (slots * t->total floats; may be NULL
 * when slots == 0). Nothing is written on failure. The tensor half of
 * loom_checkpoint_load, without the session. */
loom_status loom_ckpt_load_tensors(const char *ckpt_dir, const loom_param_table *t, uint32_t slots,
                                   float *params, float *state);
/* The same for model m's parameters only (a frozen teacher), skipping the tensors another
 * pipeline stage holds when m is a stage (loom_gpt_held_elsewhere). */
loom_status loom_ckpt_load_model_params(const char *ckpt_dir, loom_gpt *m);

#endif
