# Stand-in for envoyproxy/envoy:v1.40.0 with what docker-compose.yml relies
# on: Envoy at /usr/local/bin/envoy (the binary the other tests run), an
# `envoy` user (uid 101), and an entrypoint that, like the official one, runs
# a command starting with `envoy` or `-` as that user. The official image's
# sample /etc/envoy/envoy.yaml is left out: compose passes its own -c.
ARG BASE
FROM ${BASE}
RUN groupadd --system --gid 101 envoy \
 && useradd --system --uid 101 --gid 101 --home-dir /nonexistent --shell /usr/sbin/nologin envoy \
 && mkdir -p /etc/envoy
COPY envoy /usr/local/bin/envoy
COPY envoy-entrypoint.sh /docker-entrypoint.sh
RUN chmod 0755 /usr/local/bin/envoy /docker-entrypoint.sh && envoy --version
EXPOSE 10000
ENTRYPOINT ["/docker-entrypoint.sh"]
CMD ["envoy", "-c", "/etc/envoy/envoy.yaml"]
