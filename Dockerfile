# tightrope in a container, built with no network and no registry (README.md, "Container image").
# `python -m harness.docker.harness_image` prepares both inputs and runs this build, cached by
# a hash of everything it reads:
#   - BASE, the host's own Python imported as an image (interpreter, standard library, the
#     system libraries they and the wheels link against, /bin/sh): no image is pulled;
#   - build/image/wheels, every dependency as a wheel, gathered from the local package index
#     (`pip wheel -c constraints.txt '.[semantic]'`, so torch is the pinned CPU build).
# By hand, once those exist: docker build --network none -t tightrope .
#   docker run --network none --hostname localhost -v "$PWD/out:/work/out" tightrope
# runs the smoke suite into out/ (torchrun needs a host name that resolves: with no network
# only localhost does).
ARG BASE=tightrope-python:latest
# The final stage's image: BASE. (The tests' fast path gives BASE with the test
# environment's installed dependencies already in it, and an empty WHEELS folder; see
# docs/container.md.)
ARG FINAL_BASE=${BASE}

# The dependencies, in a stage of their own: the wheels never reach the final image, and this
# layer is rebuilt only when the wheels change (pyproject.toml or constraints.txt did).
FROM ${BASE} AS dependencies
ARG PYTHON=python3.11
ARG WHEELS=build/image/wheels
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
COPY ${WHEELS}/ /wheels/
# (With no wheels, nothing: ensurepip's own setuptools would land on the fast path's.)
RUN set -- /wheels/*.whl && if [ -e "$1" ]; then python3 -m ensurepip --default-pip >/dev/null \
    && python3 -m pip install --no-index --find-links /wheels "$@"; fi

FROM ${FINAL_BASE}
ARG PYTHON=python3.11
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    OMP_NUM_THREADS=1 MPLCONFIGDIR=/tmp/matplotlib
COPY --from=dependencies /usr/local/lib/${PYTHON}/site-packages/ /usr/local/lib/${PYTHON}/site-packages/
COPY --from=dependencies /usr/local/bin/ /usr/local/bin/
# The project's code last: a change to it rebuilds only the layers from here on.
COPY pyproject.toml README.md /opt/tightrope/
COPY faults/ /opt/tightrope/faults/
COPY harness/ /opt/tightrope/harness/
COPY reference_trainer/ /opt/tightrope/reference_trainer/
# (The base has no coreutils: Python removes the in-tree build's leftovers.)
RUN python3 -m pip install --no-index --no-deps --no-build-isolation /opt/tightrope \
    && python3 -c "import glob, shutil; [shutil.rmtree(p) for p in glob.glob('/opt/tightrope/*.egg-info') + ['/opt/tightrope/build']]"
COPY scenarios/ /opt/tightrope/scenarios/
WORKDIR /work
ENTRYPOINT ["tightrope"]
CMD ["run", "/opt/tightrope/scenarios/smoke.yaml", "--scorecard", "/work/out"]
