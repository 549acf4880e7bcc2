# The minions image: the `service` extra (the REST API, the workers, SQLite and Postgres),
# run as an unprivileged user. One image for every role; the command picks it:
#
#   docker build -t minions .
#   docker run --rm minions serve --no-worker --host 0.0.0.0     # the API (port 8000)
#   docker run --rm minions worker                                # a worker
#
# See docs/deploy.md (compose.yaml runs Postgres, the API and two workers).

FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY minions ./minions
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN wheel="$(ls /wheels/minions-*.whl)" \
    && pip install "${wheel}[service]" \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --home-dir /srv/minions --create-home minions \
    && mkdir -p /srv/minions/recipes \
    && chown minions:minions /srv/minions/recipes
USER minions
WORKDIR /srv/minions
# Workers find each run's recipe by its id under this folder (mount your recipes there).
ENV MINIONS_RECIPES=/srv/minions/recipes
EXPOSE 8000
ENTRYPOINT ["minions"]
CMD ["serve", "--no-worker", "--host", "0.0.0.0", "--port", "8000"]
