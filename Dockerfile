# meshvol image: one binary, `meshvol controller` or `meshvol node`.
#
# The development machines have a Docker client but no Docker engine, so this
# file is not built here: `make image` (hack/image.sh) builds the same image —
# the same Debian packages, the same static binary, entrypoint and cmd — as an
# OCI archive without an engine, and checks it by running its entrypoint. Keep
# the two in step.
#
# The runtime image is Debian, not distroless: the node plugin runs the host's
# DRBD through drbd-utils (drbdadm, drbdsetup), formats and mounts volumes
# (e2fsprogs, xfsprogs, util-linux for mount and losetup) and manages LVM
# backing volumes (lvm2). The controller needs none of it, but one image for
# both roles is simpler to ship and to reason about.

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so a source change does not refetch them.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=
RUN CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath \
      -ldflags "-s -w -X github.com/meshvol/meshvol/pkg/version.Version=${VERSION} -X github.com/meshvol/meshvol/pkg/version.Commit=${COMMIT}" \
      -o /out/meshvol ./cmd/meshvol

FROM debian:bookworm-slim
# The same trimming as hack/image.sh: no translations, and no xfs_scrub or
# xfs_scrub_all (never run) with the ICU and Python only they need.
RUN apt-get update \
 && apt-get install -y --no-install-recommends drbd-utils lvm2 thin-provisioning-tools e2fsprogs xfsprogs util-linux mount kmod \
 && rm -rf /var/lib/apt/lists/* /usr/share/locale/* /usr/sbin/xfs_scrub /usr/sbin/xfs_scrub_all \
 && dpkg --purge --force-depends python3 \
 && dpkg --purge --force-depends libicu72 python3.11 python3-minimal python3.11-minimal \
      libpython3-stdlib libpython3.11-stdlib libpython3.11-minimal
COPY --from=build /out/meshvol /usr/local/bin/meshvol
ENTRYPOINT ["/usr/local/bin/meshvol"]
CMD ["version"]
