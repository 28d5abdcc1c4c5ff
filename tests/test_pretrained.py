"""Which head a command drafts with: --head, else the shipped one, else a fresh one (warned)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import mtpspec.pretrained as pretrained
from mtpspec import MTPHead, Target
from mtpspec.errors import InputError


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"))


@pytest.fixture(scope="module")
def saved(target, tmp_path_factory):
    """Two saved heads with different weights: one given with --head, one 'shipped'."""
    root = tmp_path_factory.mktemp("heads")
    for name, seed in (("given", 1), ("shipped", 2)):
        torch.manual_seed(seed)
        MTPHead.for_target(target).save_pretrained(root / name)
    return root


def _same(a: MTPHead, b: MTPHead) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_the_policy(target, saved, monkeypatch):
    given, shipped = MTPHead.from_pretrained(saved / "given", target), MTPHead.from_pretrained(saved / "shipped", target)
    warnings: list[str] = []
    monkeypatch.setattr(pretrained, "shipped_head_dir", lambda name: saved / "shipped" if name == "known" else None)

    c = pretrained.resolve_head(target, "known", saved / "given", warn=warnings.append)
    assert c.directory == saved / "given" and _same(c.head, given)  # --head wins over the shipped head
    c = pretrained.resolve_head(target, "known", warn=warnings.append)
    assert c.directory == saved / "shipped" and _same(c.head, shipped)
    assert not warnings
    for name, fresh in (("known", True), ("unknown", False)):  # --fresh-head, or nothing shipped
        c = pretrained.resolve_head(target, name, fresh=fresh, warn=warnings.append)
        assert c.directory is None and c.source == "fresh (untrained)"
        assert not _same(c.head, shipped) and not _same(c.head, given)
    assert warnings == [pretrained.FRESH_HEAD_WARNING] * 2


def test_a_damaged_head_directory_is_an_input_error(target, saved, tmp_path):
    import shutil

    shutil.copytree(saved / "given", tmp_path / "h")
    (tmp_path / "h" / "mtp_head.json").write_text('{"format_version": 1}')  # no head_config, no target
    with pytest.raises(InputError, match="is not a readable mtpspec head"):
        pretrained.resolve_head(target, "x", tmp_path / "h")
    with pytest.raises(InputError, match="is not a readable mtpspec head"):
        pretrained.load_head_config(tmp_path / "h")
    with pytest.raises(InputError, match="not a saved mtpspec head"):  # core's own message for a missing dir
        pretrained.resolve_head(target, "x", tmp_path / "missing")
