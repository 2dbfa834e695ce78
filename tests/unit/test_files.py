"""Files from outside: fuser checkpoints and model folders are read as safetensors + JSON only.

A truncated or corrupt file, a config that does not match its weights, a fuser trained for
another pair, a symlink out of the allowed folders, a model folder with only pickle weights: each
gives a clear error where the user sees it (the C2C column, the CLI), and the next run works.
The fuser file checks themselves live in ``kvviz.fuser.load_fuser``; these tests reach them the
way a user does, through a run.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.core import policy
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.runner import run_handoff
from kvviz.handoffs.c2c.fuser import new_fuser
from kvviz.runtime import models
from kvviz.runtime.models import LoadedPair, PairSpec
from tests.tiny_models import tiny_gemma, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")
QUERY = "What is the secret code word?"


@pytest.fixture(scope="module")
def pair() -> LoadedPair:
    sharer, receiver = tiny_llama(), tiny_gemma()
    spec = PairSpec(name="tiny-files", sharer=sharer.name, receiver=receiver.name, description="tiny")
    return LoadedPair(spec=spec, sharer=sharer, receiver=receiver, same_shape_sender=receiver)


@pytest.fixture
def fuser_home(tmp_path, monkeypatch):
    """An allowed fuser folder (KVVIZ_FUSER_DIRS) and a place outside it."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir(), outside.mkdir()
    monkeypatch.setenv("KVVIZ_FUSER_DIRS", str(allowed))
    monkeypatch.chdir(allowed)
    monkeypatch.setattr(policy, "SHIPPED_FUSERS", allowed / "shipped")
    return allowed, outside


def save_fuser(pair, folder):
    fuser = new_fuser(pair.sharer.facts, pair.receiver.facts, width=8, pair=pair.name)
    fuser.save(folder)
    return folder


def c2c(pair, folder):
    request = HandoffRequest(query=QUERY, generation=GenerationSettings(max_new_tokens=3), options={"c2c": {"fuser": str(folder)}})
    return run_handoff("c2c", pair, request)


def works(pair, folder):
    result = c2c(pair, folder)
    assert result.applicable, result.reason
    assert run_handoff("receiver", pair, HandoffRequest(query=QUERY, generation=GenerationSettings(max_new_tokens=3))).applicable


def test_a_good_fuser_in_an_allowed_folder_runs(pair, fuser_home):
    works(pair, save_fuser(pair, fuser_home[0] / "good"))


@pytest.mark.parametrize("damage, message", [
    ("truncate", "are corrupt or not a safetensors file"),
    ("garbage", "are corrupt or not a safetensors file"),
    ("pickle", "are corrupt or not a safetensors file"),
    ("config-json", "is not valid JSON"),
    ("config-width", "does not match its weights"),
    ("no-weights", "has no weights file"),
])
def test_a_damaged_fuser_file_fails_its_column_clearly(pair, fuser_home, damage, message):
    allowed, _ = fuser_home
    folder = save_fuser(pair, allowed / damage)
    weights, config = folder / "fuser.safetensors", folder / "config.json"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(b"\x00" * 64)
    elif damage == "pickle":  # a pickle named like safetensors: never unpickled
        torch.save({"x": torch.zeros(2)}, weights)
    elif damage == "config-json":
        config.write_text("{not json")
    elif damage == "config-width":
        data = json.loads(config.read_text())
        data["width"] = data["width"] * 2
        config.write_text(json.dumps(data))
    elif damage == "no-weights":
        weights.unlink()
    result = c2c(pair, folder)
    assert not result.applicable and message in result.reason, result.reason
    works(pair, save_fuser(pair, allowed / f"{damage}-fixed"))


def test_a_fuser_trained_for_another_pair_names_both_pairs(pair, fuser_home):
    allowed, _ = fuser_home
    other = LoadedPair(spec=PairSpec(name="other", sharer="tiny-gemma", receiver="tiny-gemma", description=""),
                       sharer=pair.receiver, receiver=pair.receiver, same_shape_sender=pair.receiver)
    folder = save_fuser(other, allowed / "other")
    result = c2c(pair, folder)
    assert not result.applicable and "was trained for pair" in result.reason and "tiny-files" in result.reason
    works(pair, save_fuser(pair, allowed / "mine"))


@pytest.mark.parametrize("link", ["folder", "weights"])
def test_a_symlink_out_of_the_allowed_folders_is_refused(pair, fuser_home, link):
    allowed, outside = fuser_home
    real = save_fuser(pair, outside / "fuser")
    if link == "folder":
        folder = allowed / "linked"
        folder.symlink_to(real, target_is_directory=True)
    else:
        folder = allowed / "half-linked"
        folder.mkdir()
        (folder / "config.json").write_text((real / "config.json").read_text())
        (folder / "fuser.safetensors").symlink_to(real / "fuser.safetensors")
    result = c2c(pair, folder)
    assert not result.applicable
    assert "is outside the folders fusers may come from" in result.reason and "which leads to" in result.reason
    assert "KVVIZ_FUSER_DIRS" in result.reason
    works(pair, save_fuser(pair, allowed / "inside"))


def test_a_fuser_folder_outside_every_allowed_folder_is_refused(pair, fuser_home):
    allowed, outside = fuser_home
    result = c2c(pair, save_fuser(pair, outside / "elsewhere"))
    assert not result.applicable and "is outside the folders fusers may come from" in result.reason
    works(pair, save_fuser(pair, allowed / "here"))


# --- model folders --------------------------------------------------------------------------------


def saved_model(folder, safe=True):
    model = tiny_llama()
    model.model.save_pretrained(folder, safe_serialization=safe)
    model.tokenizer.save_pretrained(folder)
    return folder


def test_a_model_folder_with_only_pickle_weights_is_refused_unread(tmp_path, monkeypatch):
    folder = saved_model(tmp_path / "pickled")
    for weights in folder.glob("*.safetensors"):
        torch.save({"not": "read"}, folder / "pytorch_model.bin")
        weights.unlink()

    def never(*args, **kwargs):
        raise AssertionError("a pickle file was opened")

    monkeypatch.setattr(torch, "load", never)
    with pytest.raises(models.ModelLoadError, match="holds only pickle weights .pytorch_model.bin.; kvviz reads safetensors only"):
        models.load_model(str(folder), device="cpu")


def test_a_truncated_model_file_fails_clearly_and_the_next_load_works(tmp_path):
    folder = saved_model(tmp_path / "truncated")
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(models.ModelLoadError, match=f"Could not load '{folder}'"):
        models.load_model(str(folder), device="cpu")
    good = models.load_model(str(saved_model(tmp_path / "good")), device="cpu")
    assert good.facts.num_layers == 4


def test_a_model_config_that_does_not_match_its_weights_fails_clearly(tmp_path):
    folder = saved_model(tmp_path / "mismatch")
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = 128
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(models.ModelLoadError, match=f"Could not load '{folder}'"):
        models.load_model(str(folder), device="cpu")
