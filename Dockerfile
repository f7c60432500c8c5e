# The agentfleet image: one static binary on an empty base, so it builds with
# no image registry. `make image` builds the binaries with the host's Go
# toolchain (CGO_ENABLED=0) and assembles the build context in build/image:
#
#   agentfleet, fleetctl     the binaries
#   ca-certificates.crt      the host's CA bundle (TLS to NATS, LLM APIs)
#   passwd, group            the unprivileged user agentfleet (uid 10001)
#   data/, tmp/              empty directories the user owns / may write
#
# Then: docker build -f Dockerfile -t agentfleet:dev build/image
# (deploy/docker/Dockerfile.multistage builds the binaries in a Go image
# instead, for machines that can pull one.)
FROM scratch
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY passwd group /etc/
COPY --chown=10001:10001 tmp/ /tmp/
COPY --chown=10001:10001 data/ /data/
COPY agentfleet fleetctl /usr/local/bin/
USER 10001:10001
WORKDIR /data
ENV PATH=/usr/local/bin
# Every role of the fleet: nats, worker, ingress, up, healthcheck, ...
ENTRYPOINT ["/usr/local/bin/agentfleet"]
CMD ["--help"]
