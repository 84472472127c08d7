"""Generates the gRPC stubs, with their typing stubs, from Tollgate's contract
(crates/proto/proto/tollgate/v1/tollgate.proto) into tollgate/v1/, which is committed so that
the package installs from a checkout with no step of its own. Run it after changing the
contract: ``python generate.py`` (needs grpcio-tools, at the version pyproject.toml's ``dev``
extra pins: the generated code names it). ``python generate.py --check`` generates into a
temporary directory and fails if tollgate/v1/ differs (the test command runs it)."""

import filecmp
import pathlib
import sys
import tempfile

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "crates" / "proto" / "proto"
INIT = '"""Generated from tollgate.proto by generate.py."""\n'


def generate(root: pathlib.Path) -> int:
    """Writes the package's tollgate/v1/ under ``root``."""
    out = root / "tollgate" / "v1"
    out.mkdir(parents=True, exist_ok=True)
    (out / "__init__.py").write_text(INIT)
    return protoc.main(
        [
            "protoc",
            f"-I{PROTO}",
            f"--python_out={root}",
            f"--pyi_out={root}",
            f"--grpc_python_out={root}",
            str(PROTO / "tollgate" / "v1" / "tollgate.proto"),
        ]
    )


def check() -> int:
    """0 when tollgate/v1/ is what the contract generates now; else names what differs."""
    with tempfile.TemporaryDirectory() as tmp:
        if generate(pathlib.Path(tmp)) != 0:
            return 1
        fresh, committed = pathlib.Path(tmp) / "tollgate" / "v1", HERE / "tollgate" / "v1"
        names = sorted(p.name for p in fresh.iterdir() if p.is_file())
        _, differ, missing = filecmp.cmpfiles(fresh, committed, names, shallow=False)
        if differ or missing:
            print(
                f"tollgate/v1/ is not what the contract generates ({', '.join(differ + missing)}): "
                "run python generate.py and commit the result",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(check() if sys.argv[1:] == ["--check"] else generate(HERE))
