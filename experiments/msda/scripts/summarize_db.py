import sqlite3, sys, json, collections
con = sqlite3.connect(sys.argv[1])
rows = con.execute("select params, status, reason, metrics from candidates").fetchall()
c = collections.Counter(r[1] for r in rows); print(sys.argv[1], dict(c))
for p, s, r, m in rows:
    if s != "ok": print("  ", s, p, (r or "")[:200])
ok = sorted((json.loads(m)["time_us"], p, json.loads(m).get("speedup_vs"), json.loads(m).get("max_abs_err")) for p, s, r, m in rows if s == "ok")
for t, p, sp, e in ok[:8] + ok[-3:]: print(f"  {t:9.1f} {sp} err={e:.2e} {p}")
