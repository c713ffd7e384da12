/* launch.c — `loom launch`: fork N local ranks, relay their output, stop them together
 * (see launch.h).
 *
 * What not: multi-node launching (use torchrun, mpirun or srun: ranks.c reads their
 * variables), restarts, elastic worlds.
 * Invariants:
 *  - Every child runs in one process group of its own (the first child leads it), so a
 *    terminal's Ctrl-C reaches only this program, which passes it on, and killpg() reaches
 *    grandchildren too. Children are kept as zombies (waitid WNOWAIT) until the end so the
 *    group cannot vanish and its id be reused while killpg may still be sent to it.
 *  - Each child dies with this program (PR_SET_PDEATHSIG) should it be killed outright.
 *  - One thread; signals arrive through a self-pipe; every wait is a poll() with a timeout.
 *  - Rank 0's stdout is inherited, not piped: its bytes (carriage-return redraws, isatty)
 *    are exactly a one-rank run's. Every other stream is relayed a whole line per write().
 *  - When the last rank has exited the group gets SIGKILL (grandchildren a recipe left
 *    running, even after a clean run); then all children are reaped: none outlives the call.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "launch.h"
#include "base/clock.h"
#include "base/stop_signal.h"

#define GRACE_MS 2000   /* after a rank failed: SIGTERM, then this long, then SIGKILL */
/* After the user's SIGTERM, SIGINT or SIGUSR1 (passed on): the ranks finish their step and
 * save (stop_signal.h), so they get longer; a second signal kills at once. Slurm's KillWait
 * is 30 s by default. */
#define STOP_GRACE_MS 30000
#define DRAIN_MS 1000   /* after the last rank exits, how long to wait for its pipes' EOF */
/* The shm communicator's world limit (SHM_MAX_WORLD, plugins/comm/shm/shm.h): more local
 * ranks could only be refused after all of them were forked. */
#define MAX_RANKS 256
#define LINE_CAP 16384  /* a longer line is cut into pieces, each prefixed */

typedef struct stream {
    int fd, to; /* read end (-1 once closed); 1 or 2: where its lines go */
    size_t len;
    char buf[LINE_CAP];
} stream;

typedef struct child {
    pid_t pid;
    int exited, code, sig; /* seen exiting (not yet reaped): code, or the signal */
    stream *out, *err;     /* out is NULL for rank 0, whose stdout is inherited */
} child;

static int wake[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char c = (unsigned char)sig;
    if (write(wake[1], &c, 1) < 0) { /* pipe full: a wake-up is already pending */
    }
    errno = saved;
}

static const char *signal_name(int sig)
{
    static const struct { int sig; const char *name; } names[] = {
        {SIGHUP, "SIGHUP"}, {SIGINT, "SIGINT"}, {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"}, {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
        {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig)
            return names[i].name;
    return "an unnamed signal";
}

/* Write all of buf to fd; a closed or broken output is ignored (the job goes on). */
static void write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        buf += w;
        n -= (size_t)w;
    }
}

/* Emit "[rank k] line\n" as one write, so lines from different ranks never interleave. */
static void emit(int rank, int to, const char *line, size_t n)
{
    char out[LINE_CAP + 32];
    int p = snprintf(out, 32, "[rank %d] ", rank);
    memcpy(out + p, line, n);
    out[p + n] = '\n';
    write_all(to, out, (size_t)p + n + 1);
}

/* A rank's final error ("loom: ...", on stderr) is usually every rank's: the same recipe
 * fails the same check everywhere. Such lines are held until the job ends and then
 * printed once per distinct text, naming the ranks that printed it ("[ranks 0-3] loom:
 * ..."). A line that could not be held is emitted at once. */
typedef struct held_line {
    char *text;
    size_t n;
    int rank, done;
} held_line;
static held_line *held;
static int n_held, cap_held;

static int hold(int rank, const char *line, size_t n)
{
    if (n_held == cap_held) {
        int cap = cap_held ? 2 * cap_held : 16;
        held_line *h = realloc(held, (size_t)cap * sizeof *h);
        if (!h)
            return 0;
        held = h;
        cap_held = cap;
    }
    char *text = malloc(n + 1);
    if (!text)
        return 0;
    memcpy(text, line, n);
    text[n] = '\0';
    held[n_held++] = (held_line){text, n, rank, 0};
    return 1;
}

/* "[rank 3] " or "[ranks 0-2,5] " for the ranks (ascending) that printed the same line. */
static int ranks_prefix(char *out, size_t cap, const int *ranks, int n)
{
    int p = snprintf(out, cap, n == 1 ? "[rank " : "[ranks ");
    for (int i = 0; i < n && p < (int)cap - 16; ) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
            j++;
        p += snprintf(out + p, cap - (size_t)p, "%s%d", i ? "," : "", ranks[i]);
        if (j > i)
            p += snprintf(out + p, cap - (size_t)p, "%s%d", j == i + 1 ? "," : "-", ranks[j]);
        i = j + 1;
    }
    return p + snprintf(out + p, cap - (size_t)p, "] ");
}

static void flush_held(void)
{
    int *ranks = malloc((size_t)(n_held ? n_held : 1) * sizeof *ranks);
    for (int i = 0; i < n_held; i++) {
        if (held[i].done)
            continue;
        int nr = 0;
        for (int k = i; k < n_held; k++)
            if (!held[k].done && held[k].n == held[i].n && memcmp(held[k].text, held[i].text, held[i].n) == 0) {
                if (ranks)
                    ranks[nr++] = held[k].rank;
                if (k > i)
                    held[k].done = 1;
            }
        /* ranks were held in arrival order: sort them (insertion sort; few ranks) */
        for (int a = 1; ranks && a < nr; a++)
            for (int b = a; b > 0 && ranks[b - 1] > ranks[b]; b--) {
                int t = ranks[b];
                ranks[b] = ranks[b - 1];
                ranks[b - 1] = t;
            }
        char pre[256];
        int p = ranks ? ranks_prefix(pre, sizeof pre, ranks, nr)
                      : snprintf(pre, sizeof pre, "[rank %d] ", held[i].rank);
        char *out = malloc((size_t)p + held[i].n + 1);
        if (out) {
            memcpy(out, pre, (size_t)p);
            memcpy(out + p, held[i].text, held[i].n);
            out[p + held[i].n] = '\n';
            write_all(2, out, (size_t)p + held[i].n + 1);
            free(out);
        } else {
            emit(held[i].rank, 2, held[i].text, held[i].n);
        }
        held[i].done = 1;
    }
    for (int i = 0; i < n_held; i++)
        free(held[i].text);
    free(held);
    free(ranks);
    held = NULL;
    n_held = cap_held = 0;
}

/* emit, except that a rank's "loom: " lines on stderr are held (see hold). */
static void relay(int rank, int to, const char *line, size_t n)
{
    if (to == 2 && n > 6 && memcmp(line, "loom: ", 6) == 0 && hold(rank, line, n))
        return;
    emit(rank, to, line, n);
}

/* Read what is there; relay every complete line; at EOF relay the rest and close. */
static void pump(stream *s, int rank)
{
    ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n > 0)
        s->len += (size_t)n;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++)
        if (s->buf[i] == '\n') {
            relay(rank, s->to, s->buf + start, i - start);
            start = i + 1;
        }
    if (start == 0 && s->len == sizeof s->buf) /* one line fills the buffer: cut it */
        start = s->len, relay(rank, s->to, s->buf, s->len);
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    if (n <= 0) {
        if (s->len)
            relay(rank, s->to, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
    }
}

/* A port nobody listens on now (the kernel's choice); rank 0 binds it moments later. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* 16 hex digits: fixed width, so "loom-<id>" of one job is never a prefix of another's. */
static void job_id(char out[17])
{
    unsigned long long v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v)
        v = (unsigned long long)getpid() * 0x9e3779b97f4a7c15ull ^ (unsigned long long)loom_now_ms();
    if (fd >= 0)
        close(fd);
    snprintf(out, 17, "%016llx", v);
}

/* In the child, between fork and exec: only async-signal-safe calls, then _exit. */
static void exec_rank(const char *exe, char **argv, char **env, pid_t pgid, pid_t parent,
                      int out_fd, int err_fd)
{
    setpgid(0, pgid);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    if (getppid() != parent) /* the launcher died before the line above */
        _exit(127);
    int null = open("/dev/null", O_RDONLY);
    if (null > 0) {
        dup2(null, 0);
        close(null);
    }
    if (out_fd >= 0)
        dup2(out_fd, 1);
    dup2(err_fd, 2);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(exe, argv, env);
    static const char msg[] = "loom launch: cannot run this loom program again (exec failed)\n";
    write_all(2, msg, sizeof msg - 1);
    _exit(127);
}

/* The parent's environment plus the rank's variables (replacing any inherited ones). The
 * array and its strings are one allocation: free(env) frees all. */
static char **rank_env(int rank, int n, int port, const char *job)
{
    extern char **environ;
    static const char *const ours[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=",
                                       "MASTER_PORT=", "LOOM_JOB_ID="};
    size_t count = 0;
    while (environ[count])
        count++;
    char **env = malloc((count + 7) * sizeof *env + 6 * 48);
    if (!env)
        return NULL;
    char *mine = (char *)(env + count + 7);
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        int replaced = 0;
        for (size_t v = 0; v < 6; v++)
            replaced |= strncmp(environ[i], ours[v], strlen(ours[v])) == 0;
        if (!replaced)
            env[k++] = environ[i];
    }
    snprintf(mine, 48, "RANK=%d", rank);
    snprintf(mine + 48, 48, "WORLD_SIZE=%d", n);
    snprintf(mine + 96, 48, "LOCAL_RANK=%d", rank);
    snprintf(mine + 144, 48, "MASTER_ADDR=127.0.0.1");
    snprintf(mine + 192, 48, "MASTER_PORT=%d", port);
    snprintf(mine + 240, 48, "LOOM_JOB_ID=%s", job);
    for (int v = 0; v < 6; v++)
        env[k++] = mine + 48 * v;
    env[k] = NULL;
    return env;
}

static void remove_segments(const char *job)
{
    char prefix[64], path[PATH_MAX];
    snprintf(prefix, sizeof prefix, "loom-%s", job);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
            unlink(path);
        }
    closedir(d);
}

static int usage(void)
{
    fputs("usage: loom launch -n N RECIPE [key=value ...]   run N local ranks of a recipe\n",
          stderr);
    return 2;
}

typedef struct job {
    child *kids;
    int n;
    pid_t pgid;
    int fail_rank;   /* the first rank seen failing, -1 */
    int stop_signal; /* the signal that stopped the job, 0 */
    int others;      /* ranks still running when they were told to stop */
    int stopping, killed, killed_count;
    int64_t kill_at; /* SIGKILL the group then, unless all have exited */
    int grace_ms;    /* how long they were given */
    int second;      /* killed at a second signal, before the grace ran out */
} job;

static int running(const job *j)
{
    int live = 0;
    for (int k = 0; k < j->n; k++)
        live += !j->kids[k].exited;
    return live;
}

/* Only while one of ours is unreaped (so the group is ours); never group 0 (our own). */
static void signal_group(const job *j, int sig)
{
    if (j->pgid > 0)
        killpg(j->pgid, sig);
}

/* A user's signal is passed on as it came (the ranks save, then exit); after a failure each
 * running rank first gets a SIGTERM marked LOOM_STOP_NOW, since no collective save can
 * follow a peer's death, then the group its plain SIGTERM (for what the ranks started). */
static void stop_all(job *j, int sig, int failed)
{
    j->others = running(j);
    j->stopping = 1;
    j->grace_ms = failed ? GRACE_MS : STOP_GRACE_MS;
    j->kill_at = (int64_t)loom_now_ms() + j->grace_ms;
    for (int k = 0; failed && k < j->n; k++)
        if (!j->kids[k].exited)
            sigqueue(j->kids[k].pid, sig, (union sigval){.sival_int = LOOM_STOP_NOW});
    if (j->others)
        signal_group(j, sig);
}

static void kill_all(job *j)
{
    if (!j->killed)
        j->killed_count = running(j);
    j->killed = 1;
    signal_group(j, SIGKILL); /* the group still exists: its exited members are unreaped */
}

/* Note children that have exited (left unreaped); the first failure stops the others. */
static void check_children(job *j)
{
    for (int k = 0; k < j->n; k++) {
        child *c = &j->kids[k];
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (c->exited || waitid(P_PID, (id_t)c->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 ||
            si.si_pid != c->pid)
            continue;
        c->exited = 1;
        if (si.si_code == CLD_EXITED)
            c->code = si.si_status;
        else
            c->sig = si.si_status;
        if ((c->code || c->sig) && j->fail_rank < 0 && !j->stop_signal) {
            j->fail_rank = k;
            stop_all(j, SIGTERM, 1);
        }
    }
}

static void on_launcher_signal(job *j, int sig)
{
    if (j->stopping) {
        j->second = !j->killed;
        kill_all(j); /* a second Ctrl-C: do not wait for the grace period */
    }
    else {
        j->stop_signal = sig;
        stop_all(j, sig, 0);
    }
}

/* Start rank k. 0, or -1 with errno set (the caller stops what has started). */
static int start_rank(job *j, int k, const char *exe, char **argv, int port, const char *id)
{
    child *c = &j->kids[k];
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    errno = ENOMEM;
    char **env = rank_env(k, j->n, port, id);
    c->err = calloc(1, sizeof *c->err);
    c->out = k > 0 ? calloc(1, sizeof *c->out) : NULL;
    pid_t pid = -1, parent = getpid();
    if (env && c->err && (k == 0 || c->out) && pipe2(err, O_CLOEXEC) == 0 &&
        (k == 0 || pipe2(out, O_CLOEXEC) == 0) && (pid = fork()) == 0)
        exec_rank(exe, argv, env, j->pgid, parent, out[1], err[1]);
    int e = errno;
    free(env);
    for (int p = 0; p < 2; p++) { /* the child has its copies; ours of its ends go */
        if (out[p] >= 0 && (p == 1 || pid < 0))
            close(out[p]);
        if (err[p] >= 0 && (p == 1 || pid < 0))
            close(err[p]);
    }
    if (pid < 0) {
        errno = e;
        return -1;
    }
    if (j->pgid == 0)
        j->pgid = pid;
    setpgid(pid, j->pgid); /* also done by the child: whichever runs first wins the race */
    c->pid = pid;
    *c->err = (stream){.fd = err[0], .to = 2};
    if (c->out)
        *c->out = (stream){.fd = out[0], .to = 1};
    return 0;
}

/* The one-line verdict, and the exit status. */
static int verdict(const job *j)
{
    char tail[160] = "";
    if (j->killed_count > 0 && j->second)
        snprintf(tail, sizeof tail, "; %d %s killed at the second signal", j->killed_count,
                 j->killed_count == 1 ? "rank was" : "ranks were");
    else if (j->killed_count > 0)
        snprintf(tail, sizeof tail, "; %d %s not stop within %d s and %s killed", j->killed_count,
                 j->killed_count == 1 ? "rank did" : "ranks did", j->grace_ms / 1000,
                 j->killed_count == 1 ? "was" : "were");
    if (j->stop_signal) {
        fprintf(stderr, "loom launch: stopped by %s (passed on to the %d running %s)%s\n",
                signal_name(j->stop_signal), j->others, j->others == 1 ? "rank" : "ranks", tail);
        return 128 + j->stop_signal;
    }
    if (j->fail_rank < 0)
        return 0;
    const child *c = &j->kids[j->fail_rank];
    char what[96], others[96];
    if (c->sig)
        snprintf(what, sizeof what, "was killed by signal %d (%s)", c->sig, signal_name(c->sig));
    else
        snprintf(what, sizeof what, "exited with status %d", c->code);
    if (j->n == 1)
        others[0] = '\0';
    else if (j->others == j->n - 1)
        snprintf(others, sizeof others, j->n == 2 ? "; stopped the other rank"
                                                  : "; stopped the other %d ranks", j->others);
    else if (j->others > 0)
        snprintf(others, sizeof others, "; stopped the %d other %s still running", j->others,
                 j->others == 1 ? "rank" : "ranks");
    else
        snprintf(others, sizeof others, "; no other rank was still running");
    fprintf(stderr, "loom launch: rank %d %s%s%s\n", j->fail_rank, what, others, tail);
    return c->sig ? 128 + c->sig : c->code;
}

/* Relay output and signals until every rank has exited, then reap them all. */
static void supervise(job *j)
{
    int64_t drain_until = 0;
    struct pollfd *pfd = calloc((size_t)(2 * j->n + 1), sizeof *pfd);
    stream **owner = calloc((size_t)(2 * j->n + 1), sizeof *owner);
    int *rank_of = calloc((size_t)(2 * j->n + 1), sizeof *rank_of);
    for (int checks = 1;; ) {
        if (checks)
            check_children(j);
        int64_t now = (int64_t)loom_now_ms();
        if (j->stopping && !j->killed && now >= j->kill_at && running(j))
            kill_all(j);
        int n = 0;
        pfd[n++] = (struct pollfd){.fd = wake[0], .events = POLLIN};
        for (int k = 0; k < j->n && pfd && owner && rank_of; k++)
            for (int s = 0; s < 2; s++) {
                stream *st = s ? j->kids[k].err : j->kids[k].out;
                if (st && st->fd >= 0) {
                    owner[n] = st;
                    rank_of[n] = k;
                    pfd[n++] = (struct pollfd){.fd = st->fd, .events = POLLIN};
                }
            }
        if (running(j) == 0) {
            if (drain_until == 0) {
                signal_group(j, SIGKILL); /* grandchildren left behind, holding our pipes */
                drain_until = now + DRAIN_MS;
            }
            if (n == 1 || now >= drain_until || !pfd)
                break;
        }
        int64_t next = now + 1000; /* a bound, in case a SIGCHLD was coalesced away */
        if (j->stopping && !j->killed && j->kill_at < next)
            next = j->kill_at;
        if (drain_until && drain_until < next)
            next = drain_until;
        int rc = pfd ? poll(pfd, (nfds_t)n, (int)(next > now ? next - now : 0)) : -1;
        checks = rc == 0;
        if (rc < 0) {
            if (errno != EINTR)
                poll(NULL, 0, 100); /* cannot poll (out of memory): check back shortly */
            checks = 1;
            continue;
        }
        if (pfd[0].revents & POLLIN) {
            unsigned char sig[64];
            ssize_t got = read(wake[0], sig, sizeof sig);
            for (ssize_t i = 0; i < got; i++) {
                if (sig[i] == SIGCHLD)
                    checks = 1;
                else
                    on_launcher_signal(j, sig[i]);
            }
        }
        for (int i = 1; i < n; i++)
            if (pfd[i].revents)
                pump(owner[i], rank_of[i]);
    }
    flush_held();
    for (int k = 0; k < j->n; k++) {
        stream *ss[2] = {j->kids[k].out, j->kids[k].err};
        for (int s = 0; s < 2; s++)
            if (ss[s] && ss[s]->fd >= 0)
                close(ss[s]->fd);
        while (waitpid(j->kids[k].pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    free(pfd);
    free(owner);
    free(rank_of);
}

/* N ranks share this node's cores: unless the user chose, each rank gets cores/N compute
 * threads, and OpenMP threads sleep rather than spin when they wait, since a spinning
 * thread steals the core another rank needs (a step can slow many times over). */
static void share_cores(int n)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (!getenv("OMP_NUM_THREADS")) {
        char v[32];
        snprintf(v, sizeof v, "%ld", cores > n ? cores / n : 1L);
        setenv("OMP_NUM_THREADS", v, 1);
    }
    if (!getenv("OMP_WAIT_POLICY") && n > 1)
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
}

int loom_launch_main(int argc, char **argv)
{
    long n = -1;
    int i = 0;
    if (i < argc && strncmp(argv[i], "-n", 2) == 0) {
        const char *v = argv[i][2] ? argv[i] + 2 : (i + 1 < argc ? argv[++i] : NULL);
        char *end = NULL;
        n = v ? strtol(v, &end, 10) : -1;
        if (!v || !*v || *end) {
            fprintf(stderr, "loom launch: -n needs a number of ranks (e.g. loom launch -n 4 "
                            "recipe.lua), got '%s'\n", v ? v : "");
            return 2;
        }
        i++;
    }
    if (n < 0 || i >= argc)
        return usage();
    if (n < 1 || n > MAX_RANKS) {
        fprintf(stderr, "loom launch: -n must be between 1 and %d (got %ld)%s\n", MAX_RANKS, n,
                n > MAX_RANKS ? ": the shm communicator joins at most 256 ranks of one machine; "
                                "for more, start ranks on several machines (torchrun, mpirun or "
                                "srun, comm = \"mpi\")" : "");
        return 2;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && n > 16 * cores && !getenv("LOOM_LAUNCH_OVERSUBSCRIBE")) {
        fprintf(stderr, "loom launch: -n %ld is more than 16 ranks per core on this machine's %ld "
                "cores; each rank is a full process with its own model copy; use fewer ranks, or "
                "set LOOM_LAUNCH_OVERSUBSCRIBE=1 to start them anyway\n", n, cores);
        return 2;
    }
    const char *recipe = argv[i];
    if (access(recipe, R_OK) != 0) {
        fprintf(stderr, "loom launch: cannot read recipe '%s': %s\n", recipe, strerror(errno));
        return 1;
    }
    for (int a = i + 1; a < argc; a++)
        if (!strchr(argv[a], '=') || argv[a][0] == '=') {
            fprintf(stderr, "loom launch: '%s' is not a key=value override (e.g. steps=20)\n",
                    argv[a]);
            return 2;
        }
    static char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    int port = free_port();
    if (len <= 0 || port < 0) {
        fprintf(stderr, "loom launch: cannot %s: %s\n",
                len <= 0 ? "find this program (/proc/self/exe)" : "find a free port on 127.0.0.1",
                strerror(errno));
        return 1;
    }
    exe[len] = '\0';
    share_cores((int)n);
    char id[17];
    job_id(id);
    /* argv of each rank: loom run RECIPE overrides... */
    char **rargv = calloc((size_t)(argc - i + 3), sizeof *rargv);
    job j = {.n = (int)n, .fail_rank = -1, .kids = calloc((size_t)n, sizeof(child))};
    if (!rargv || !j.kids || pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        fprintf(stderr, "loom launch: cannot start: %s\n", strerror(errno ? errno : ENOMEM));
        return 1;
    }
    rargv[0] = exe;
    rargv[1] = "run";
    for (int a = i; a < argc; a++)
        rargv[2 + a - i] = argv[a];
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD};
    for (size_t s = 0; s < sizeof sigs / sizeof sigs[0]; s++)
        sigaction(sigs[s], &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill the supervisor */
    int started = 0;
    for (; started < j.n; started++)
        if (start_rank(&j, started, exe, rargv, port, id) != 0)
            break;
    if (started < j.n) {
        int e = errno;
        j.n = started;
        if (started > 0)
            kill_all(&j);
        supervise(&j);
        fprintf(stderr, "loom launch: cannot start rank %d: %s\n", started, strerror(e));
        remove_segments(id);
        return 1;
    }
    supervise(&j);
    remove_segments(id);
    int rc = verdict(&j);
    for (int k = 0; k < j.n; k++) {
        free(j.kids[k].out);
        free(j.kids[k].err);
    }
    free(j.kids);
    free(rargv);
    return rc;
}
