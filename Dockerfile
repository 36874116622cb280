# syntax=docker/dockerfile:1
# One image carries three binaries: /manager (the operator, the default entrypoint), /relay (the
# publisher the operator runs once per shard with `command: ["/relay"]`) and /kubectl-outbox (the
# kubectl plugin, for `kubectl cp` or a debug container; releases also ship it as archives).

FROM golang:1.26 AS builder
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=dev
WORKDIR /workspace
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY outboxdb/ outboxdb/
COPY migrations/ migrations/
COPY relay/ relay/
COPY outbox/ outbox/
COPY internal/ internal/
COPY plugin/ plugin/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/manager ./cmd/manager && \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/relay ./cmd/relay && \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/kubectl-outbox ./cmd/kubectl-outbox

# Static binaries on a minimal, non-root base.
FROM gcr.io/distroless/static-debian12:nonroot
WORKDIR /
COPY --from=builder /out/manager /out/relay /out/kubectl-outbox /
USER 65532:65532
ENTRYPOINT ["/manager"]
