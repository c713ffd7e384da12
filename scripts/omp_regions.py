"""omp_regions.py A B STEPS [ROWS]: per step, the difference of two omp_regions_shim
outputs (runs of STEPS more steps apart), region functions named from the libraries'
symbols, biggest first (scripts/omp-regions)."""
import sys, subprocess, functools
@functools.lru_cache(None)
def syms(lib):
    out = subprocess.run(['nm', lib], capture_output=True, text=True).stdout
    s = []
    for l in out.splitlines():
        p = l.split()
        if len(p) >= 3 and p[1] in 'tTwW':
            s.append((int(p[0], 16), p[2]))
    s.sort(); return s
def name(lib, off):
    best = '?'
    for a, n in syms(lib):
        if a <= off: best = n
        else: break
    return lib.split('/')[-1].replace('loom-','').replace('.so','') + ':' + best.replace('._omp_fn','.')
def rd(f):
    d = {}
    for l in open(f):
        p = l.split()
        k = name(p[10], int(p[11], 16))
        v = [float(x) for x in p[:10]]
        if k in d: d[k] = [a+b for a,b in zip(d[k], v)]
        else: d[k] = v
    return d
a = rd(sys.argv[1]); b = rd(sys.argv[2]); steps = float(sys.argv[3])
rows = []
for k, v in b.items():
    v0 = a.get(k, [0]*10)
    rows.append([(x - y) / steps for x, y in zip(v, v0)] + [k])
rows.sort(key=lambda r: -(r[4] + r[7]))
tot = [sum(r[i] for r in rows) for i in range(10)]
print(f"{'regions':>8} {'wall':>7} {'cpu0':>7} {'cpu1':>7} {'max':>7} {'imbal':>6} {'forklat':>7} {'serial':>7} {'cfork':>6} {'cjoin':>6}  (ms per step)")
print(f"{tot[0]:8.0f} {tot[1]:7.2f} {tot[2]:7.2f} {tot[3]:7.2f} {tot[4]:7.2f} {tot[5]:6.2f} {tot[6]:7.2f} {tot[7]:7.2f} {tot[8]:6.1f} {tot[9]:6.1f}  TOTAL")
for r in rows[:int(sys.argv[4]) if len(sys.argv) > 4 else 25]:
    print(f"{r[0]:8.1f} {r[1]:7.2f} {r[2]:7.2f} {r[3]:7.2f} {r[4]:7.2f} {r[5]:6.2f} {r[6]:7.2f} {r[7]:7.2f} {r[8]:6.1f} {r[9]:6.1f}  {r[10]}")
