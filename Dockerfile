# GPU node image: vLLM (its official image is the base), llama.cpp's CUDA server, and the gateway.
# Build: docker build -t gateway .      Run: see the README ("Docker").
FROM ghcr.io/ggml-org/llama.cpp:server-cuda-b8211 AS llama

FROM vllm/vllm-openai:v0.32.0

# llama-server and the shared libraries beside it, from llama.cpp's own CUDA server image
COPY --from=llama /app/ /opt/llama.cpp/
ENV LD_LIBRARY_PATH=/opt/llama.cpp

# the gateway in a virtual environment of its own: it starts vLLM (the base image's `vllm serve`)
# and llama-server as processes and never imports them, so their pins cannot clash
WORKDIR /opt/gateway
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY backends ./backends
COPY config ./config
RUN python3 -m venv /opt/gateway/venv \
 && /opt/gateway/venv/bin/pip install --no-cache-dir /opt/gateway

ENV GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8000 \
    GATEWAY_STATE_DIR=/var/lib/gateway \
    GATEWAY_VLLM_COMMAND='["vllm", "serve"]' \
    GATEWAY_LLAMA_SERVER_COMMAND='["/opt/llama.cpp/llama-server"]' \
    HF_HOME=/root/.cache/huggingface

VOLUME ["/root/.cache/huggingface", "/var/lib/gateway"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["/opt/gateway/venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["/opt/gateway/venv/bin/gateway", "serve"]
