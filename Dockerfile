# research-agent as an MCP server over streamable HTTP (and the `chroma` server of the same chromadb release:
# docker-compose.yml runs both from this image). CPU-only torch from the PyTorch CPU index: PyPI's Linux torch
# is the multi-GB CUDA build.
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

WORKDIR /app
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml constraints.txt README.md LICENSE ./
COPY research_agent ./research_agent
COPY scripts/fetch_models.py ./scripts/fetch_models.py
RUN pip install -c constraints.txt . && useradd --create-home app && mkdir -p /data /docs && chown app /data /docs

USER app
# The Hugging Face cache (the reranker, downloaded on the first query or by scripts/fetch_models.py).
ENV HF_HOME=/home/app/.cache/huggingface
EXPOSE 8765
CMD ["research-agent", "serve", "--transport", "http", "--host", "0.0.0.0", "--port", "8765"]
