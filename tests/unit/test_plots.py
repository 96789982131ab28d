"""The loss plot: a PNG from a run's metrics.csv (no engines)."""

from __future__ import annotations

import pytest

from raydp_llm.core.errors import InputError
from raydp_llm.training.driver.plots import plot_loss

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HEADER = "step,tokens,train_loss,val_loss,lr\n"


def test_plot_loss_writes_a_png(tmp_path):
    run_dir = tmp_path / "2024-01-01_00-00-00"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text(
        HEADER
        + "0,0,4.2,4.3,0.001\n50,25600,2.9,,0.001\n100,51200,2.1,nan,0.001\n"
        "150,76800,1.8,2.0,0.001\n"
    )

    out = plot_loss(run_dir / "metrics.csv", tmp_path / "plots" / "loss.png")

    assert out == tmp_path / "plots" / "loss.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5_000


def test_plot_loss_without_rows_is_one_line(tmp_path):
    (tmp_path / "metrics.csv").write_text(HEADER)
    with pytest.raises(InputError, match="no metrics rows to plot"):
        plot_loss(tmp_path / "metrics.csv", tmp_path / "loss.png")
