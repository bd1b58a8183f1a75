"""frontier_jax.run.curves: the periodic (subset), final (full split) and round-trip validations are separate
series, labelled with their token counts, and the figure carries the run's name (the data handed to matplotlib
is checked, not pixels)."""

from __future__ import annotations

from frontier_jax.run import curves


def test_curves_draw_periodic_final_and_round_trip_validation_as_separate_series(tmp_path, monkeypatch):
    rows = [dict(kind="train", step=s, loss=4.0 - s, tokens=100 * s, train_seconds=float(s)) for s in (1, 2, 3, 4)]
    rows.insert(2, dict(kind="val", step=2, loss=3.0, bpb=3.00, tokens=200, train_seconds=2.0, val_tokens=64))
    rows += [dict(kind="val", step=4, loss=3.1, bpb=3.07, tokens=400, train_seconds=4.0, val_tokens=512, final=True),
             dict(kind="roundtrip", step=4, loss=3.1, bpb=3.08, tokens=400, train_seconds=4.0, val_tokens=512)]
    series = curves.curve_series(rows)
    assert series["val_periodic"]["y"] == [3.00] and series["val_periodic"]["tokens"] == [200]
    assert series["val_final"]["y"] == [3.07] and series["roundtrip"]["y"] == [3.08]
    assert series["train"]["y"] == [3.0, 2.0, 1.0, 0.0] and series["train"]["train_seconds"] == [1.0, 2.0, 3.0, 4.0]
    assert "subset: 64 tokens" in series["val_periodic"]["label"]
    assert "full split: 512 tokens" in series["val_final"]["label"]
    # what reaches matplotlib: one line per series, each with its own label, and the title
    import matplotlib.axes
    import matplotlib.figure

    drawn, titles = [], []
    real_plot, real_title = matplotlib.axes.Axes.plot, matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda ax, x, y, **kw: drawn.append((kw["label"], list(y))) or real_plot(ax, x, y, **kw))
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle",
                        lambda fig, t, **kw: titles.append(t) or real_title(fig, t, **kw))
    curves.plot_run(rows, tmp_path / "c.png", "run-a: tiny (jax)")
    labels = {label for label, _ in drawn}
    assert labels == {s["label"] for s in series.values()} and len(drawn) == 8  # 4 series x 2 x-axes
    assert ("final val (full split: 512 tokens)", [3.07]) in drawn and titles == ["run-a: tiny (jax)"]


def test_axes_read_plainly_and_a_periodic_validation_of_the_whole_split_says_so(tmp_path, monkeypatch):
    """Token ticks read 200k / 1.5M (full counts ran into each other), bpb ticks carry no "+2.86" offset, and a
    periodic validation as large as the final one (the demo: val_max_tokens above the split) is labelled
    full split, not subset."""
    import matplotlib.pyplot as plt

    rows = [dict(kind="train", step=s, loss=4.0 - s / 10, tokens=300_000 * s, train_seconds=float(s)) for s in range(1, 6)]
    rows += [dict(kind="val", step=s, loss=3.0, bpb=2.8612 + s * 1e-4, tokens=300_000 * s, train_seconds=float(s),
                  val_tokens=4096) for s in (2, 4)]
    rows += [dict(kind="val", step=5, loss=3.0, bpb=2.8611, tokens=1_500_000, train_seconds=5.0, val_tokens=4096,
                  final=True)]
    assert curves.curve_series(rows)["val_periodic"]["label"] == "periodic val (full split: 4,096 tokens)"
    assert curves.curve_series(rows[:-1])["val_periodic"]["label"].startswith("periodic val (up to")
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    curves.plot_run(rows, tmp_path / "c.png", "run")
    fig = figures[-1]
    fig.canvas.draw()
    tokens_ax, bpb_ax = fig.axes[1], fig.axes[2]
    ticks = [t.get_text() for t in tokens_ax.get_xticklabels() if t.get_text()]
    assert "1.5M" in ticks and all(len(t) <= 5 for t in ticks), ticks
    assert bpb_ax.yaxis.get_major_formatter().get_offset() == ""
    assert all(t.get_text().startswith("2.86") for t in bpb_ax.get_yticklabels() if t.get_text())


def test_the_title_names_what_the_run_changed_from_its_config_file(tmp_path):
    """--set / --budget / --seed differences from configs/<name>.py, the data paths left out."""
    from frontier_jax.config import apply_overrides, load_config, to_dict
    from frontier_jax.run import rundir

    tiny = load_config(curves.CONFIGS / "tiny.py")
    run = apply_overrides(tiny, ["model.num_layers=2", "train.budget_seconds=30", "data.data_dir='/x'", "optim.fused=True"])
    assert curves.overrides(to_dict(run), to_dict(tiny)) == ["model.num_layers=2", "optim.fused=True",
                                                             "train.budget_seconds=30.0"]
    rundir.write_json(tmp_path / "config.json", to_dict(run))
    assert curves.run_overrides(tmp_path, "tiny") == ["model.num_layers=2", "optim.fused=True", "train.budget_seconds=30.0"]
    assert curves.run_overrides(tmp_path, "no-such-config") == []
