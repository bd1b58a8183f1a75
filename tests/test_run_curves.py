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
