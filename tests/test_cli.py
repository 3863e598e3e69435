"""The command line's errors: one line naming the problem, exit status 2
for a wrong command line (1 for a model that cannot be converted)."""

import pytest

from keras_jumbo.cli import main
from keras_jumbo.models import NonDeepViT

TINY = dict(
    hidden_dim=16, num_heads=2, image_size=16, patch_size=8, num_classes=5
)


@pytest.fixture(scope="module")
def branchy(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "branchy.keras"
    NonDeepViT(2, 2, **TINY).save(path)  # λ = 0: not joined yet
    return str(path)


def run(capsys, *argv):
    status = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    return status, err


def test_usage_errors_are_one_line(capsys, tmp_path, branchy):
    out = str(tmp_path / "x.tflite")
    cases = [
        (
            ("export", str(tmp_path / "missing.keras"), "--tflite", out),
            "no such file",
        ),
        (("export", branchy), "nothing to do"),
        (
            ("export", branchy, "--tflite", out, "--force"),
            "--force only applies with --reparameterize",
        ),
        (
            (
                "export",
                branchy,
                "--onnx",
                str(tmp_path / "x.onnx"),
                "--quantize",
                "float16",
            ),
            "--quantize float16 only applies to --tflite",
        ),
        (("count", str(tmp_path / "notes.txt")), "not a .keras model"),
    ]
    (tmp_path / "notes.txt").write_text("not a model")
    for argv, expected in cases:
        status, err = run(capsys, *argv)
        assert status == 2, (argv, err)
        assert len(err) == 1 and expected in err[0], (argv, err)
        assert err[0].startswith("keras-jumbo: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_unjoined_model_error_speaks_command_line(capsys, tmp_path, branchy):
    status, err = run(
        capsys,
        "export",
        branchy,
        "--reparameterize",
        "--tflite",
        str(tmp_path / "x.tflite"),
    )
    assert status == 1
    assert "--force" in err[0] and "force=True" not in err[0], err


def test_count_unknown_name(capsys):
    status, err = run(capsys, "count", "jumbo_vit_huge")
    assert status == 1 and "Unknown model name" in err[0]
    assert "jumbo_vit_nano" in err[0]
