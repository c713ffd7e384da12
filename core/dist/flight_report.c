/* flight_report.c — what a rank does on its first failed wait: dump its ring, read the
 * others' dumps and name the rank(s) that never reached the operation it is stuck in.
 *
 * What: the dump is a text file <dir>/flight-rank<R>.txt, written whole then renamed (a
 * reader never sees half of one), and its last lines on stderr. Its head says who wrote
 * it (job, rank, world), which operation this rank is stuck in, and per group the members
 * and how many collectives it started; then the ring, oldest first. Reading: the dumps of
 * this job's ranks that appear within a grace period (half the comm timeout, 0.2..5 s,
 * sleeping 50 ms between looks; it ends early once every member of the stuck group has
 * dumped). A member that wrote none is dead or stopped (SIGSTOP, a debugger); a member
 * whose count of collectives on the group is below the stuck one's number never reached
 * it, and its own dump says where it is instead. A send or recv waits for one member, its
 * peer, and for the peer's matching operation: send #k to this rank for a recv #k from it
 * (and the other way round); the peer's ring says how far it got in that direction.
 * What not: no communication (the communicator is what failed, and the rendezvous store
 * is served by rank 0, which may be the stopped one): the dumps meet in a directory, so
 * across nodes the verdict needs a shared directory (LOOM_FLIGHT_DIR); each rank still
 * dumps its own ring either way.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "flight.h"

#define TAIL_LINES 8

static const char *state_name(int s)
{
    return s == FLIGHT_STARTED ? "started" : s == FLIGHT_COMPLETED ? "completed" : "failed";
}

static const char *job_id(void)
{
    const char *j = getenv("LOOM_JOB_ID");
    return j && j[0] ? j : "-";
}

static void dump_path(char *out, size_t cap, int rank)
{
    snprintf(out, cap, "%s/flight-rank%d.txt", loom_flight_settings()->dir, rank);
}

/* mkdir -p: the flight directory may be a checkpoint dir not made yet (first save). */
static void make_dirs(const char *dir)
{
    char buf[1100];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

/* 1 when the dump was written. */
static int write_dump(const flight_group *g, const flight_entry *stuck, const char *why,
                      const char *path)
{
    const flight_settings *s = loom_flight_settings();
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    make_dirs(s->dir);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "loom[%d]: flight: cannot write '%s': %s\n", s->rank, tmp, strerror(errno));
        return 0;
    }
    char oneline[1024];
    snprintf(oneline, sizeof oneline, "%s", why);
    for (char *p = oneline; *p; p++)
        if (*p == '\n')
            *p = ' ';
    fprintf(f, "loom flight recorder v1 job=%s rank=%d world=%d pid=%d\n", job_id(), s->rank,
            s->world, (int)getpid());
    fprintf(f, "why: %s\n", oneline);
    if (stuck && !stuck->coll)
        fprintf(f, "stuck: %s %s %llu %zu peer %d\n", g->name, stuck->op,
                (unsigned long long)stuck->seq, stuck->bytes, stuck->peer);
    else if (stuck)
        fprintf(f, "stuck: %s %s %llu %zu\n", g->name, stuck->op, (unsigned long long)stuck->seq,
                stuck->bytes);
    else
        fprintf(f, "stuck: - - 0 0\n");
    const flight_group *gs;
    int ng = loom_flight_groups(&gs, 0);
    for (int i = 0; i < ng; i++) {
        if (gs[i].closed)
            continue;
        fprintf(f, "group %s started=%llu completed=%llu members=", gs[i].name,
                (unsigned long long)gs[i].coll_started, (unsigned long long)gs[i].coll_completed);
        for (int m = 0; m < gs[i].n; m++)
            fprintf(f, "%s%d", m ? "," : "", gs[i].members[m]);
        fprintf(f, "%s\n", gs[i].n ? "" : "-");
    }
    flight_entry *e = malloc(LOOM_FLIGHT_ENTRIES * sizeof *e);
    int n = e ? loom_flight_snapshot(e) : 0;
    double t0 = n ? e[0].t_start : 0;
    fprintf(f, "entries %d (id, ms since the first, group, op, seq, peer/root, bytes, state, ms)\n", n);
    for (int i = 0; i < n; i++)
        fprintf(f, "%llu %.3f %s %s #%llu %d %zu %s %.3f\n", (unsigned long long)e[i].id,
                (e[i].t_start - t0) * 1e3, e[i].group, e[i].op, (unsigned long long)e[i].seq,
                e[i].peer, e[i].bytes, state_name(e[i].state),
                e[i].t_end > 0 ? (e[i].t_end - e[i].t_start) * 1e3 : -1.0);
    int bad = ferror(f);
    int written = !(fclose(f) != 0 || bad || rename(tmp, path) != 0);
    if (!written) {
        fprintf(stderr, "loom[%d]: flight: cannot write '%s'\n", s->rank, path);
        unlink(tmp);
    }
    /* The tail on stderr: what this rank did last. */
    int from = n > TAIL_LINES ? n - TAIL_LINES : 0;
    fprintf(stderr, "loom[%d]: flight: last %d of %d operations (all in %s):\n", s->rank, n - from,
            n, path);
    for (int i = from; i < n; i++)
        fprintf(stderr, "loom[%d]: flight:   %s #%llu on %s, %zu bytes, %s\n", s->rank, e[i].op,
                (unsigned long long)e[i].seq, e[i].group, e[i].bytes, state_name(e[i].state));
    free(e);
    return written;
}

/* What another rank's dump says, as far as the verdict needs it. */
typedef struct peer_dump {
    int present;
    char stuck_group[16], stuck_op[24];
    unsigned long long stuck_seq;
    unsigned long long started; /* on the group with the stuck group's name and members */
    int has_group;
    unsigned long long reached; /* p2p: the newest seq of the matching op to this rank */
} peer_dump;

static void members_text(const flight_group *g, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int m = 0; m < g->n && used + 12 < cap; m++)
        used += (size_t)snprintf(out + used, cap - used, "%s%d", m ? "," : "", g->members[m]);
    if (g->n == 0)
        snprintf(out, cap, "-");
}

/* match: for a stuck send or recv, the peer's op that pairs with it ("recv" or "send"),
 * whose entries to this rank (group rank me) are looked for in the ring; NULL otherwise. */
static int read_dump(const char *path, const flight_group *g, const char *match, peer_dump *d)
{
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[1400], job[64] = "", want[1024];
    members_text(g, want, sizeof want);
    int ok = fgets(line, sizeof line, f) && sscanf(line, "loom flight recorder v1 job=%63s", job) == 1 &&
             strcmp(job, job_id()) == 0;
    if (ok && strcmp(job, "-") == 0) { /* no job id: only a dump of this incident */
        struct stat st;
        ok = fstat(fileno(f), &st) == 0 &&
             st.st_mtime + loom_flight_settings()->timeout_ms / 1000 + 10 >= time(NULL);
    }
    while (ok && fgets(line, sizeof line, f)) {
        char name[16], members[1024];
        unsigned long long started, completed;
        if (strncmp(line, "stuck: ", 7) == 0)
            sscanf(line, "stuck: %15s %23s %llu", d->stuck_group, d->stuck_op, &d->stuck_seq);
        else if (sscanf(line, "group %15s started=%llu completed=%llu members=%1023s", name,
                        &started, &completed, members) == 4 &&
                 strcmp(name, g->name) == 0 && strcmp(members, want) == 0) {
            d->started = started;
            d->has_group = 1;
        } else if (strncmp(line, "entries ", 8) == 0)
            break;
    }
    while (ok && match && fgets(line, sizeof line, f)) { /* "id ms group op #seq peer ..." */
        char grp[16], op[24];
        unsigned long long seq;
        int peer;
        if (sscanf(line, "%*u %*f %15s %23s #%llu %d", grp, op, &seq, &peer) == 4 &&
            !strcmp(grp, g->name) && !strcmp(op, match) && peer == g->me && seq > d->reached)
            d->reached = seq;
    }
    fclose(f);
    d->present = ok;
    return ok;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* printf onto the end of out, truncating at cap. */
static void append(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *out, size_t cap, const char *fmt, ...)
{
    size_t used = strlen(out);
    if (used + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + used, cap - used, fmt, ap);
    va_end(ap);
}

void loom_flight_report(const flight_group *g, const flight_entry *stuck, const char *why,
                        char *out, size_t cap)
{
    const flight_settings *s = loom_flight_settings();
    char path[1100];
    dump_path(path, sizeof path, s->rank);
    int written = write_dump(g, stuck, why, path);
    out[0] = '\0';
    if (!written) {
        snprintf(out, cap, "flight recorder: cannot write dumps in %s (set LOOM_FLIGHT_DIR); "
                 "this rank's last operations are on stderr", s->dir);
        return;
    }
    if (!stuck || g->n == 0) {
        snprintf(out, cap, "flight recorder dump in %s", path);
        return;
    }
    /* The members that matter: every rank of a collective's group, the peer of a p2p. */
    int coll = stuck->coll;
    const char *match = coll ? NULL : strcmp(stuck->op, "send") == 0 ? "recv" : "send";
    int want[64], n_want = 0;
    for (int m = 0; m < g->n && n_want < 64; m++)
        if (m != g->me && (coll || m == stuck->peer))
            want[n_want++] = m;
    peer_dump d[64];
    int grace = s->timeout_ms / 2 < 200 ? 200 : s->timeout_ms / 2 > 5000 ? 5000 : s->timeout_ms / 2;
    for (int waited = 0;; waited += 50) {
        int all = 1;
        for (int i = 0; i < n_want; i++) {
            char p[1100];
            dump_path(p, sizeof p, g->members[want[i]]);
            all &= read_dump(p, g, match, &d[i]);
        }
        if (all || waited >= grace)
            break;
        sleep_ms(50);
    }
    char missing[512] = "", behind[1024] = "", waiting[512] = "";
    int n_missing = 0, n_behind = 0, n_waiting = 0;
    /* here: what this rank waits in; there: what the others must reach (the same
     * collective, or the peer's matching send or recv) */
    char here[96], there[96], mine[128];
    snprintf(here, sizeof here, "%s #%llu on %s", stuck->op, (unsigned long long)stuck->seq, g->name);
    snprintf(there, sizeof there, "%s", here);
    snprintf(mine, sizeof mine, "it");
    if (!coll && stuck->peer >= 0 && stuck->peer < g->n) {
        int to = !strcmp(match, "send");
        snprintf(there, sizeof there, "%s #%llu %s rank %d on %s", match,
                 (unsigned long long)stuck->seq, to ? "to" : "from", s->rank, g->name);
        snprintf(mine, sizeof mine, "its %s #%llu %s rank %d", stuck->op,
                 (unsigned long long)stuck->seq, to ? "from" : "to", g->members[stuck->peer]);
    }
    for (int i = 0; i < n_want; i++) {
        int r = g->members[want[i]];
        int short_of = coll ? d[i].has_group && d[i].started < stuck->seq
                            : d[i].reached < stuck->seq;
        if (!d[i].present) {
            append(missing, sizeof missing, "%s%d", n_missing++ ? ", " : "", r);
        } else if (short_of) {
            append(behind, sizeof behind, "%srank %d never reached %s: it is in %s #%llu on %s",
                   n_behind++ ? "; " : "", r, there, d[i].stuck_op, d[i].stuck_seq,
                   d[i].stuck_group);
        } else {
            append(waiting, sizeof waiting, "%s%d", n_waiting++ ? ", " : "", r);
        }
    }
    append(out, cap, "flight recorder: ");
    if (n_missing)
        append(out, cap, "rank%s %s left no dump (dead or stopped) and never completed %s; ",
               n_missing > 1 ? "s" : "", missing, there);
    if (n_behind)
        append(out, cap, "%s; ", behind);
    if (!n_missing && !n_behind && coll)
        append(out, cap, "every rank of %s reached %s; ", g->name, here);
    else if (!n_missing && !n_behind)
        append(out, cap, "rank %s reached %s; ", waiting, there);
    append(out, cap, "rank %d waited in %s%s%s; dumps: %s/flight-rank*.txt", s->rank, mine,
           n_waiting ? " with ranks " : "", waiting, s->dir);
    fprintf(stderr, "loom[%d]: %s\n", s->rank, out);
}
