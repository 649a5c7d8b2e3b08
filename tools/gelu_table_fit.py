#!/usr/bin/env python3
"""Regenerates the GELU tables of src/kernels/cpu/gelu_table.hpp (NOTE [gelu tables]).

  .peers-venv/bin/python tools/gelu_table_fit.py > tables.txt

Needs mpmath and numpy (the peers' virtual environment has both). Prints each
piece's fit error as a comment, then kGeluForwardTable (g) and
kGeluBackwardTable (d) as C++ arrays, rows from r^5 down to r^0 (the header
lays the same values out four to a line).
"""
# Piecewise quintic tables for g(a) = a*Phi(-a) and d(a) = Phi(-a) - a*phi(a), a = |x|,
# intervals centred at n*h (h = 1/4), n = 0..30, local r = a - n*h; interval 31 is zero.
import numpy as np, mpmath as mp, struct
mp.mp.dps = 40
H = mp.mpf(1)/4; DEG = 5; NONZERO = 31
def q(a): return mp.erfc(a/mp.sqrt(2))/2
def phi(a): return mp.exp(-a*a/2)/mp.sqrt(2*mp.pi)
def g(a): return a*q(a)
def d(a): return q(a) - a*phi(a)
def f32(v): return struct.unpack('f', struct.pack('f', float(v)))[0]
def fit(f, n, fixed):
    c = n*H; lo = max(mp.mpf(0), c - H/2); hi = c + H/2
    pts = [ (lo+hi)/2 + (hi-lo)/2*mp.cos(mp.pi*(j+mp.mpf(1)/2)/60) for j in range(60)]
    coef = dict(fixed)
    for k in range(DEG+1):
        if k in coef: continue
        free = [j for j in range(DEG+1) if j not in coef]
        A = mp.matrix([[ (t-c)**j for j in free] for t in pts])
        b = mp.matrix([ f(t) - sum(coef[j]*(t-c)**j for j in coef) for t in pts])
        sol = mp.lu_solve(A.T*A, A.T*b)
        coef[k] = mp.mpf(f32(sol[free.index(k)]))   # round the lowest free one, refit the rest
    err = max(abs(f(t) - sum(coef[j]*(t-c)**j for j in range(DEG+1))) for t in pts)
    rel = max(abs(f(t) - sum(coef[j]*(t-c)**j for j in range(DEG+1)))/abs(f(t)) for t in pts)
    return [coef[j] for j in range(DEG+1)], err, rel
TABLES = {}
for name, f, fixed0 in [('g', g, {0: mp.mpf(0), 1: mp.mpf(0.5)}), ('d', d, {0: mp.mpf(0.5)})]:
    table = []
    worst = (0, 0)
    for n in range(NONZERO):
        co, err, rel = fit(f, n, fixed0 if n == 0 else {})
        table.append(co); worst = (max(worst[0], err), max(worst[1], rel if n*H < 6.5 else 0))
        print(f"// {name} n={n} abs {float(err):.2e} rel {float(rel):.2e}")
    table.append([mp.mpf(0)]*(DEG+1))
    print(f"// {name}: worst abs {float(worst[0]):.2e}, worst rel (a < 6.5) {float(worst[1]):.2e}")
    TABLES[name] = table

def emit(name, table):
    out = [f"inline constexpr float {name}[kGeluDegree + 1][kGeluPieces] = {{"]
    for k in range(DEG, -1, -1):
        vals = [str(np.float32(float(table[n][k]))) for n in range(32)]
        vals = [v if ('e' in v or '.' in v) else v + '.0' for v in vals]
        out.append("    {" + ", ".join(v + 'f' for v in vals) + f"}},  // r^{k}")
    out.append("};")
    return "\n".join(out)

print(emit('kGeluForwardTable', TABLES['g']))
print()
print(emit('kGeluBackwardTable', TABLES['d']))
