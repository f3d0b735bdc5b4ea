# Runtime image for the parallelism planner API.
#
#   docker build -t parallelism-planner .
#   docker run --rm -p 8000:8000 parallelism-planner
#
# BASE_IMAGE can point at any Debian-like image whose `python`/`pip` on PATH
# are CPython >= 3.11 (see docs/docker.md).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# Unprivileged account that runs the service.
RUN groupadd --gid 10001 app \
    && useradd --uid 10001 --gid app --create-home --home-dir /home/app \
        --shell /usr/sbin/nologin app

# Runtime dependencies only (no [test] extra). They get their own layer, read
# from pyproject.toml, so that it is reused until the dependencies change.
WORKDIR /tmp/src
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
    && pip install --no-cache-dir -r requirements.txt

# The project itself, from a throwaway source copy; the service then runs from
# the installed package.
COPY optimizer ./optimizer
COPY api ./api
COPY hardware_catalog ./hardware_catalog
RUN pip install --no-cache-dir --no-deps . \
    && pip check \
    && rm -rf /tmp/src

WORKDIR /home/app
USER 10001:10001

EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; r = urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4); sys.exit(0 if r.status == 200 else 1)"]

# uvicorn with header / body read timeouts and a connection cap (api/server.py, docs/api.md).
ENV PPLAN_HOST=0.0.0.0 PPLAN_PORT=8000
CMD ["python", "-m", "api.server"]
