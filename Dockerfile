# Build stage: the release binary.
FROM rust:1.88-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY benches benches
# Two crates patched until upstream releases their fixes (Cargo.toml's
# [patch.crates-io]).
COPY vendor vendor
RUN cargo build --release --locked --bin mailgate

# Runtime stage: the binary, its config and templates, a non-root user.
FROM debian:bookworm-slim
# The system's CA store, for a link with roots = "system" (a company CA is
# added with update-ca-certificates in a derived image, or named by
# SSL_CERT_FILE); links without it use the roots compiled in.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --no-create-home mailgate
COPY --from=build /src/target/release/mailgate /usr/local/bin/mailgate
COPY config /etc/mailgate/config
COPY templates /etc/mailgate/templates
WORKDIR /etc/mailgate
USER 10001
ENV MAILGATE_CONFIG=/etc/mailgate/config/docker.toml \
    MAILGATE_LOG_FORMAT=json
EXPOSE 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["mailgate", "probe"]
ENTRYPOINT ["mailgate"]
CMD ["worker"]
