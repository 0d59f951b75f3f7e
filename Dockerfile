# The vram calculator, served by Streamlit on port 8501.
#   docker build -t vram .
#   docker run --rm -p 8501:8501 --read-only --tmpfs /tmp vram
# A team's own GPU list and prices: mount a CSV and point VRAM_GPUS_CSV at it (docs/app.md).
# Several replicas behind a proxy, Kubernetes, sizing: docs/deploy.md.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --gid 10001 app && useradd --no-create-home --home-dir /tmp --uid 10001 --gid 10001 app
WORKDIR /app

# Dependencies first, so code changes reuse the layer. The names come from pyproject.toml (the
# core dependencies and the `app` extra); every version, transitive ones included, from requirements/app.lock (CI installs
# with the same pins). `pip check` fails the build if the lock and the names disagree.
COPY pyproject.toml ./
COPY requirements/app.lock ./requirements/app.lock
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print(*p['dependencies'], *p['optional-dependencies']['app'], sep='\n')" > /tmp/requirements.txt \
    && pip install --constraint requirements/app.lock --requirement /tmp/requirements.txt \
    && pip check \
    && rm /tmp/requirements.txt

# The app runs from /app, where `vram` and `data/` sit next to it.
COPY vram ./vram
COPY data ./data
COPY app.py calculator.py ./
COPY ui ./ui
COPY pages ./pages
COPY .streamlit ./.streamlit
# Byte-code now, so a read-only container never needs to write it (and starts faster).
RUN python -m compileall -q /app

# Read-only root filesystem: the only place anything may be written is /tmp (mount a tmpfs
# there). HOME=/tmp sends Streamlit's ~/.streamlit there (it writes nothing with the settings
# in .streamlit/config.toml: headless, no usage statistics); uploads and downloads stay in
# memory; no byte-code is written at run time.
ENV HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false \
    STREAMLIT_SERVER_HEADLESS=true

# Numeric, so Kubernetes can check runAsNonRoot against the image itself.
USER 10001:10001
EXPOSE 8501

# No curl in a slim image: ask the health endpoint with Python's standard library.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; r=urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4); sys.exit(0 if r.read().strip()==b'ok' else 1)"]

# A team's GPU list (VRAM_GPUS_CSV) is checked before the server starts: a bad one stops the
# container with the file and line named, so the orchestrator notices at once (docs/app.md).
CMD ["sh", "-c", "python -m vram gpus > /dev/null && exec streamlit run app.py --server.port=8501 --server.address=0.0.0.0"]
