#!/usr/bin/env bash
# Extra CI setup for the export, serving and web-page tests (tests/interop, tests/serve).
# Run it after .ci/run has created and activated .venv-ci and installed '.[test]', e.g.
#     . .venv-ci/bin/activate && .ci/extra.sh && python -m pytest -q
# Without it those tests skip with a reason naming the missing package or binary.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore DEBIAN_FRONTEND=noninteractive
# Debian's Chromium and its WebDriver, for the headless-browser test of the demo page.
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver
# tokenizers; transformers, ctranslate2, onnx, onnxruntime, onnxscript; fastapi, uvicorn, sse-starlette;
# selenium, httpx; tensorboard; sentencex (documents); torchao (quant); py3langid (clean).
pip install -q -e '.[test,export,serve,web-test,tensorboard,pretrained,documents,quant,clean]'
python -c "import tokenizers, schemathesis, transformers, ctranslate2, onnx, onnxruntime, onnxscript, fastapi, uvicorn, sse_starlette, selenium, tensorboard, sentencex, torchao, py3langid; print('extras ok')"
# Triton (the triton extra) is not installed here: pytriton 0.7's Python backend needs numpy < 2; .ci/run
# tests it in an environment of its own (job triton).
