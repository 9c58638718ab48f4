# The sluicegate service as an image: built with the workspace's locked dependencies, run
# as a non-root user on a distroless base (glibc and nothing else: no shell, no package
# manager). Build: docker build -t sluicegate .   Run: docker run -p 8080:8080 sluicegate
# Probes: GET /healthz (the process is up), GET /readyz (the store answers) on port 8080;
# there is no shell to run a HEALTHCHECK in, so orchestrators probe over HTTP
# (deploy/kubernetes/deployment.yaml).

# The toolchain crates/sluicegate-server/symbol-order.txt was written for (tests/it/deploy.rs
# holds the two together): on x86_64 its LLD links the functions a start runs together, and
# the service at idle holds about 30 % less memory.
FROM rust:1.95.0-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sluicegate-server \
    && install -D target/release/sluicegate /out/sluicegate

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/sluicegate /usr/local/bin/sluicegate
# envoyproxy/ratelimit's command: run as /bin/ratelimit, the binary is
# `sluicegate serve --compat envoy` on envoy's environment, so a Deployment that names that
# command (Envoy Gateway's) keeps it when it swaps the image (docs/envoy-gateway.md).
COPY --from=build /out/sluicegate /bin/ratelimit
# envoyproxy/ratelimit's layout: descriptor files under /data/ratelimit/config. The image
# carries the example rules there; mount a directory of your own over it.
COPY crates/sluicegate-server/src/server/example.yaml /data/ratelimit/config/example.yaml
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/sluicegate"]
CMD ["serve", "--listen", "0.0.0.0:8080", "--config", "/data/ratelimit/config"]
