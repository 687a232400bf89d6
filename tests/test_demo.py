"""The demo's figure is the config's, not one seed's: `configs/two_circles.yaml`, as `make demo`
trains it, reaches test top-1 >= 0.98 on a seed never used to choose it (the config was chosen
on seeds 0-9: studies/demo_seeds/, whose `train_and_test` this runs; seeds 12 and 13, run here
until they cost a minute each on a Zen 3, passed too). 25-80 s on 2 cores."""

from pathlib import Path

import pytest

from tools.demo_seeds import train_and_test

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_demo_config_relates_the_circles_for_a_seed_it_was_not_chosen_on(tmp_path):
    seed = 11
    result = train_and_test(str(ROOT / "configs/two_circles.yaml"), seed, tmp_path / "runs", [])
    assert result["test_acc"] >= 0.98, f"seed {seed}: test top-1 {result['test_acc']:.4f}"
