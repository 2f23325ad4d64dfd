# Stand-in for prom/prometheus with the layout docker-compose.yml relies on:
# /bin/prometheus reading /etc/prometheus/prometheus.yml, data in /prometheus,
# run as nobody. The binaries and web assets are Debian's prometheus package
# as installed on the host (scripts/setup.sh installs it).
ARG BASE
FROM ${BASE}
COPY prometheus/ /
# /bin is /usr/bin (merged /usr): /bin/prometheus is the package's binary.
RUN mkdir -p /prometheus \
 && chown nobody:nogroup /prometheus \
 && prometheus --version
USER nobody
WORKDIR /prometheus
VOLUME ["/prometheus"]
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
