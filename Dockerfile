# The vram calculator, served by Streamlit on port 8501.
#   docker build -t vram .
#   docker run --rm -p 8501:8501 vram
# A team's own GPU list and prices: mount a CSV and point VRAM_GPUS_CSV at it (docs/app.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 app
WORKDIR /app

# Dependencies first (read from pyproject.toml, the one list), so code changes reuse the layer.
COPY pyproject.toml ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt

# The app runs from /app, where `vram` and `data/` sit next to it.
COPY vram ./vram
COPY data ./data
COPY app.py ./
COPY ui ./ui
COPY pages ./pages
COPY .streamlit ./.streamlit

USER app
EXPOSE 8501

# No curl in a slim image: ask the health endpoint with Python's standard library.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request,sys; r=urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4); sys.exit(0 if r.read().strip()==b'ok' else 1)"

CMD ["streamlit", "run", "app.py", "--server.port=8501", "--server.address=0.0.0.0"]
