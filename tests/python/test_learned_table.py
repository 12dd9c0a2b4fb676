#!/usr/bin/env python3
"""analysis/learned_table.py on a hand-made experiment folder: seeds pooled into one row with a
confidence interval over the seeds, policies without seeds spread over requests, the unseen
families' table, and the two DistillCache rewards side by side.

usage: test_learned_table.py ANALYSIS_DIR
"""
import contextlib
import io
import math
import os
import sys
import tempfile

SWEEP_COLUMNS = ("trace,request,mode,policy,params,budget,budget_tokens,kept_fraction,mean_recall,mean_kl,p95_kl,"
                 "mean_out_err,p95_out_err,compressed_bytes,budget_bytes,peak_bytes,final_bytes,footprint_byte_steps,"
                 "host_bytes,eval_queries,rows,keep_hash,position_fallback,budget_semantics,decode_peak_bytes,"
                 "mean_out_sq,est_kl")
VERIFY_COLUMNS = ("request,task,mode,policy,params,budget,budget_tokens,kept_fraction,compressed_bytes,budget_bytes,"
                  "steps,live_kl,max_kl,top1,ppl,reference_ppl,task_score,reference_task_score,same_tokens,seconds,"
                  "policy_steps,position_fallback,budget_semantics,decode_peak_bytes,generated")


def write(folder):
    d = os.path.join(folder, "query-aware")
    os.makedirs(d)
    with open(os.path.join(folder, "families.txt"), "w") as f:
        f.write("train: recall\nunseen: continue\n")
    sweep = ["# kvsim sweep results (a hand-made fixture)", '# config: {"schema": 2}', SWEEP_COLUMNS]
    verify = ["# kvsim verify results (a hand-made fixture)", '# config: {"schema": 2}', VERIFY_COLUMNS]
    by_budget = list(verify)
    requests = ["heldout-recall-0", "heldout-continue-0"]
    # distillcache, three seeds: live KL per seed 0.1, 0.2, 0.3 (same on both requests).
    rows = [("distillcache", f'"model=out/query-aware/seed{s}/distillcache.h5"', 0.1 * s) for s in (1, 2, 3)]
    rows += [("distillcache", f'"model=out/query-aware/seed{s}/distillcache_live.h5"', 0.05 * s) for s in (1, 2, 3)]
    rows += [("snapkv", "", None)]
    for req in requests:
        for policy, params, kl in rows:
            live = kl if kl is not None else (0.4 if req.endswith("recall-0") else 0.8)
            sweep.append(f"t.h5,{req},query-aware,{policy},{params},0.25,10,0.25,0.9,{live / 2},0,0,0,1,1,1,1,1,0,8,8,1,0,"
                         f"peak/32,1,0.01,{live / 3}")
            # The live runs of a budget may stand in a file of their own (verify_b<budget>.csv).
            (by_budget if policy == "snapkv" else verify).append(
                f"{req},long,query-aware,{policy},{params},0.25,10,0.25,1,1,8,{live},0,0.9,1.1,1.0,0.5,1.0,"
                f"0,1,host,0,peak/32,1,x")
    with open(os.path.join(d, "sweep.csv"), "w") as f:
        f.write("\n".join(sweep) + "\n")
    with open(os.path.join(d, "verify.csv"), "w") as f:
        f.write("\n".join(verify) + "\n")
    with open(os.path.join(d, "verify_b0.25.csv"), "w") as f:
        f.write("\n".join(by_budget) + "\n")


def main():
    sys.path.insert(0, sys.argv[1])
    import learned_table

    with tempfile.TemporaryDirectory() as folder:
        write(folder)
        sys.argv = ["learned_table.py", folder]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            learned_table.main()
        text = out.getvalue()
    print(text)
    lines = text.splitlines()
    row = next(l for l in lines if l.startswith("| 0.25 | distillcache[distillcache] |"))
    # Seeds 0.1, 0.2, 0.3: mean 0.2, CI 4.303 * 0.1 / sqrt(3).
    assert "0.2000 ± %.4f" % (4.303 * 0.1 / math.sqrt(3)) in row and "3 seeds" in row, row
    snap = next(l for l in lines if l.startswith("| 0.25 | snapkv |"))
    assert "0.6000 ± %.4f" % (12.706 * math.sqrt(0.08) / math.sqrt(2)) in snap and "2 requests" in snap, snap
    unseen = text[text.index("families never seen"):text.index("rewards")]
    assert "| 0.25 | snapkv | 0.4000 |" in unseen and "1 requests" in unseen, unseen
    assert "| 0.25 | live | 1: 0.0500, 2: 0.1000, 3: 0.1500 | 0.1000 ±" in text, text
    assert "| 0.25 | trace (calibrated estimate) | 1: 0.1000, 2: 0.2000, 3: 0.3000 |" in text, text
    print("learned table: passed")


if __name__ == "__main__":
    main()
