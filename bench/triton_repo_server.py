"""The ``tritonserver`` pytriton bundles (the triton extra), run on a model repository that
``transduce export --format triton`` wrote: bench/serving.py's ``triton-repo`` engine and
tests/interop/test_export_triton.py."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path


def tritonserver_command(repo: str | os.PathLike, http_port: int, grpc_port: int, workdir: str | os.PathLike
                         ) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``repo`` with pytriton's bundled ``tritonserver`` on
    loopback: its Python backend, with the stub of this Python, assembled in ``workdir``."""
    import pytriton

    bundled = Path(pytriton.__file__).parent / "tritonserver"
    backends = Path(workdir) / "backends"
    shutil.copytree(bundled / "backends", backends, dirs_exist_ok=True)
    stub = bundled / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copy2(stub / "triton_python_backend_stub", backends / "python" / "triton_python_backend_stub")
    libs = [str(Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs")]
    libdir = sysconfig.get_config_var("LIBDIR")  # the stub must load this interpreter's libpython
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join([libdir, *libs, os.environ.get("LD_LIBRARY_PATH", "")]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    command = [str(bundled / "bin" / "tritonserver"), f"--model-repository={Path(repo).resolve()}",
               f"--backend-directory={backends}", "--http-address=127.0.0.1", f"--http-port={http_port}",
               "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}", "--allow-metrics=false",
               "--exit-timeout-secs=30"]
    return command, env
