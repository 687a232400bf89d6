"""The tools of tools/ at a tiny size: each runs end to end and reports what it says."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    """`python tools/NAME ARGS` in a subprocess, as a user runs it."""
    command = [sys.executable, str(ROOT / "tools" / name), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_accuracy_vs_minutes_draws_each_run(tmp_path, capsys):
    from tools.accuracy_vs_minutes import main

    header = "epoch,step,time/minutes,train/lr,val/acc\n"
    (tmp_path / "a.csv").write_text(header + "0,9,,0.001,\n0,10,1.5,,0.40\n1,20,3.0,,0.55\n")
    (tmp_path / "b.csv").write_text(header + "0,10,2.0,,0.30\n1,20,4.0,,0.35\n2,30,6.0,,0.33\n")
    main([f"budget={tmp_path / 'a.csv'}", f"fixed={tmp_path / 'b.csv'}", "--out", str(tmp_path / "m.png")])
    out = capsys.readouterr().out
    assert "budget: last val/acc 0.5500 at 3.0 min, best 0.5500 at 3.0 min" in out
    assert "fixed: last val/acc 0.3300 at 6.0 min, best 0.3500 at 4.0 min" in out
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"
    # PATH*FACTOR: minutes drawn times the factor (a faster machine's run in another's minutes)
    main([f"scaled={tmp_path / 'a.csv'}*1.5", "--out", str(tmp_path / "s.png")])
    assert "scaled: last val/acc 0.5500 at 4.5 min, best 0.5500 at 4.5 min" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="must be a number"):
        main([f"bad={tmp_path / 'a.csv'}*x", "--out", str(tmp_path / "s.png")])
    with pytest.raises(SystemExit, match="no rows with both"):
        (tmp_path / "c.csv").write_text(header)
        main([f"c={tmp_path / 'c.csv'}", "--out", str(tmp_path / "c.png")])


@pytest.mark.slow
def test_demo_seeds_reports_each_seed_and_goes_on_where_it_stopped(tmp_path):
    tiny = [
        "--", "--model.vit.preset", "micro", "--data.init_args.num_train", "256",
        "--data.init_args.num_val", "64", "--data.init_args.num_test", "64", "--trainer.max_epochs", "2",
    ]  # fmt: skip
    out, runs = tmp_path / "probe", tmp_path / "runs"
    result = run_script("demo_seeds.py", "--seeds", "3", "--out", str(out), "--runs", str(runs), *tiny)
    assert result.returncode == 0, result.stderr[-2000:]
    result = run_script("demo_seeds.py", "--seeds", "3", "4", "--out", str(out), "--runs", str(runs), *tiny)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "seed 3:" not in result.stdout and "seed 4:" in result.stdout  # seed 3 was done
    table = (out / "table.md").read_text()
    rows = re.findall(r"^\| (\d) \| (0\.\d{4}) \| ([0-9., ]+) \|", table, re.MULTILINE)
    assert [r[0] for r in rows] == ["3", "4"] and all(len(r[2].split(", ")) == 2 for r in rows)
    assert "min / median / max" in table
    other = run_script(
        "demo_seeds.py", "--seeds", "5", "--out", str(out), "--runs", str(runs), "--", "--model.lr", "1"
    )
    assert other.returncode != 0 and "holds another config or options" in other.stderr
