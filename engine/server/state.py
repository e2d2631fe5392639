"""ServerState: what the routes share — the engine (None while it loads), settings, metrics, stored responses."""

from __future__ import annotations

import asyncio
import functools
import time

from engine.api import Engine
from engine.server.http.errors import APIError, from_engine_error
from engine.server.bridge.generation import Generation, Wakeups
from engine.server.bridge.images import ImageOptions
from engine.server.openai.logprobs import TokenBytes
from engine.server.http.metrics import Metrics, Outcome
from engine.server.bridge.prompting import Prompt, generation_defaults
from engine.server.responses.store import ResponseStore
from engine.server.http.settings import ServerSettings
from engine.server.http.workers import Workers


class ServerState:
    def __init__(self, settings: ServerSettings, engine=None, params_hook=None):
        """`params_hook(SamplingParams)`: called on every request's parameters just before submit
        (tests use it to script the model's output); None in normal use."""
        self.settings = settings
        self.metrics = Metrics()
        self.responses = ResponseStore()          # the Responses API's stored responses
        self.workers = Workers(settings.prepare_threads, settings.prepare_queue)
        self.params_hook = params_hook
        self.created = int(time.time())
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.defaults: dict = {}
        self.token_bytes: TokenBytes | None = None
        self.wakeups: Wakeups | None = None      # made on the event loop, by the first request
        if engine is not None:
            self.set_engine(engine)

    def set_engine(self, engine) -> None:
        self.defaults = generation_defaults(engine.config.model)
        self.token_bytes = TokenBytes(engine.tokenizer)
        self.engine = engine

    def ready(self) -> Engine:
        """The engine, or a 503 while it loads (or after it failed to)."""
        if self.engine is None:
            why = f"the model failed to load: {self.load_error}" if self.load_error else "the model is still loading"
            raise APIError(503, why, "unavailable", headers={"retry-after": "5"})
        return self.engine

    def check_model(self, name: str) -> None:
        if name != self.settings.model_id:
            raise APIError(404, f"The model {name!r} does not exist; this server serves "
                                f"{self.settings.model_id!r}", "not_found", param="model", code="model_not_found")

    def image_options(self) -> ImageOptions:
        """What requests' images may be: the engine's limits, the server's URL setting."""
        engine = self.ready()
        c = engine.config
        return ImageOptions(vision=engine.accepts_images, max_images=c.max_images, max_bytes=c.max_image_bytes,
                            allow_urls=self.settings.allow_image_urls, url_timeout_s=self.settings.image_url_timeout_s)

    async def start(self, groups: list[list[Prompt]], raw: bool = False) -> list[Generation]:
        """Submit one request's generations: each group is the samples of one prompt (n of them). The first of
        each group runs first; the others are submitted once it has prefilled, so that their prompt comes from
        the prefix cache. Engine refusals become API errors (429/529, 400, 503), and cancel what started."""
        c = self.ready().config
        total, capacity = sum(len(g) for g in groups), c.max_running + c.max_queue
        if total > capacity:     # a 429 would have the client retry for ever
            raise APIError(400, f"this request asks for {total} generations ({len(groups)} prompts, n = "
                                f"{len(groups[0])}); the server holds at most {capacity} at once (profile "
                                f"{c.profile}: {c.max_running} running, {c.max_queue} queued): send fewer",
                           param="n" if len(groups[0]) > 1 else "prompt", code="too_many_generations")
        runs: list[list[Generation]] = []             # each prompt's generations
        try:
            for group in groups:
                runs.append([await self._submit(group[0], raw)])
            if any(len(g) > 1 for g in groups):
                await asyncio.gather(*(run[0].started.wait() for run in runs))
            for group, run in zip(groups, runs):
                run += [await self._submit(p, raw) for p in group[1:]]
        except (APIError, asyncio.CancelledError):
            for run in runs:
                for gen in run:
                    gen.cancel()
            raise
        gens = [gen for run in runs for gen in run]
        outcome = Outcome(self.metrics)
        for gen in gens:
            gen.outcome = outcome
        return gens

    async def _submit(self, prompt: Prompt, raw: bool) -> Generation:
        """Engine.submit, through Generation; a request with a grammar is submitted on the Workers (the engine compiles
        it there: milliseconds, a large schema more) within grammar_timeout_s."""
        if self.params_hook is not None:
            self.params_hook(prompt.params)
        loop = asyncio.get_running_loop()
        if self.wakeups is None or self.wakeups.loop is not loop:
            self.wakeups = Wakeups(loop)
        make = functools.partial(Generation, self.engine, prompt, self.wakeups, keepalive_s=self.settings.keepalive_s,
                                 interval_s=self.settings.stream_interval_s, raw=raw, metrics=self.metrics)
        constraint = prompt.params.constraint
        try:
            if constraint is None:
                return make()
            return await self.workers.run(make, timeout=self.settings.grammar_timeout_s, abandoned=Generation.cancel)
        except asyncio.TimeoutError:
            raise APIError(400, f"the grammar of this request's structured output or tools did not compile within "
                                f"{self.settings.grammar_timeout_s:g} s; simplify the schema", code="grammar_too_slow",
                           param="response_format" if constraint is not None and constraint.json_schema is not None
                           else "tools") \
                from None
        except APIError:
            raise
        except Exception as e:
            error = from_engine_error(e)
            if error.status == 400 and error.param is None and prompt.params.constraint is not None:
                error.param = "tools" if str(e).startswith("tool ") else "response_format"  # (the grammar's error)
            raise error from None
