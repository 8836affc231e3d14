"""The service's model control (service.Service): load and unload an export's models through Triton's repository
API (MODEL_CONTROL=explicit), one action at a time, without failing the calls of models an action is changing."""
import asyncio
import os
import time

from model_library.model_errors import ErrorKind

from .errors import ApiError, NotFound, Unavailable


class ModelControl:
    """Service's admin actions: the state they keep is Service's (registry, triton, settings, admin_lock,
    changing_models, triton_started)."""

    async def load(self, model_id):
        return await asyncio.get_running_loop().run_in_executor(None, self.load_now, model_id)

    async def unload(self, model_id):
        return await asyncio.get_running_loop().run_in_executor(None, self.unload_now, model_id)

    def admin_card(self, model_id):
        self.registry.scan()
        card = self.registry.find(model_id)
        if card is None:
            raise NotFound(f"no export named '{model_id}' in the model repository", ErrorKind.MODEL_NOT_FOUND)
        if self.settings.model_control != "explicit":
            raise ApiError("models load and unload only with MODEL_CONTROL=explicit", ErrorKind.MODEL_CONTROL_OFF)
        if not self.triton_started:  # a model call during Triton's start-up kills the calling stub
            raise Unavailable("tritonserver is still starting: try again in a few seconds", ErrorKind.STARTING)
        return card

    def changing(self, card, change):
        """Runs change(): meanwhile the card's stubs may exit (unload, or a reload of a changed step), and the
        readiness thread must not fail their calls: an unload lets them finish."""
        self.changing_models |= set(card.models)
        try:
            change()
        finally:
            self.changing_models -= set(card.models)
            self.refresh_readiness()

    def load_now(self, model_id):
        with self.admin_lock:
            card, started = self.admin_card(model_id), time.monotonic()
            repository = self.registry.repository
            missing = [m for m in card.models if not os.path.isfile(os.path.join(repository, m, "config.pbtxt"))]
            if missing:
                raise ApiError(f"model '{card.id}' cannot load: its export is incomplete, the model repository has "
                               f"no {', '.join(missing)} (export it again)", ErrorKind.LOAD_FAILED)
            self.registry.unloaded_by_admin.discard(card.name)
            self.registry.loaded_by_admin.add(card.name)

            def load():
                try:  # the ensemble brings its steps; the BLS callers are no ensemble's steps: loaded on their own
                    for model in (m for m in (card.name, card.bls, card.rerank, card.chunks, card.image) if m):
                        self.triton.control("load", model)
                except RuntimeError as error:  # Triton says why (missing file, bad config...)
                    self.registry.loaded_by_admin.discard(card.name)
                    if not self.triton.ready(card.name):  # (a failed reload leaves the old version serving)
                        # the steps that did load would stay loaded for nothing, stubs and memory included
                        self.unload_steps([m for m in self.own_steps(card) if self.triton.ready(m)])
                    raise ApiError(f"model '{card.id}' did not load: {error}", ErrorKind.LOAD_FAILED) from None
            self.changing(card, load)
            return time.monotonic() - started

    def unload_now(self, model_id):
        with self.admin_lock:
            card, started = self.admin_card(model_id), time.monotonic()
            self.registry.unloaded_by_admin.add(card.name)  # from now on new requests get 404
            self.registry.loaded_by_admin.discard(card.name)

            def unload():
                try:  # Triton lets the requests in flight finish before the models go (each holds its models)
                    self.triton.control("unload", card.name, unload_dependents=True)
                    # unload_dependents takes only the steps loaded as the ensemble's dependencies: a step loaded
                    # explicitly (--load-model=*) stays unless unloaded too (not when another export uses it)
                    self.unload_steps(self.own_steps(card), also_wait=[card.name])
                except RuntimeError as error:
                    raise ApiError(f"model '{card.id}' did not unload: {error}", ErrorKind.UNLOAD_FAILED) from None
            self.changing(card, unload)
            return time.monotonic() - started

    def own_steps(self, card):
        shared = {m for c in self.registry.cards_by_name.values() if c.name != card.name for m in c.models}
        steps = (card.image, card.tokenizer, card.encoder, card.bls, card.rerank, card.chunks, card.image_preprocess,
                 card.image_encoder)
        return [m for m in steps if m and m not in shared]

    def unload_steps(self, steps, also_wait=()):
        """Unload `steps` and wait until Triton holds none of them (an unload answers at once, but the instances
        finish their requests and finalize first): the repository index says, else readiness."""
        for step in steps:
            self.triton.control("unload", step)
        models, deadline = [*also_wait, *steps], time.monotonic() + self.settings.request_timeout_s
        while models and time.monotonic() < deadline:
            states = self.triton.states()
            if not (any(states.get(m, set()) & {"READY", "LOADING", "UNLOADING"} for m in models) if states is not None
                    else any(self.triton.ready(m) for m in models)):
                return
            time.sleep(0.1)
