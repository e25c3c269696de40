// Spawning a function-based actor without undefined behaviour.
//
// CAF 0.17 keeps a spawn's extra arguments in a std::shared_ptr<std::tuple<Ts...>> which it
// leaves null when there are none, and then dereferences it anyway
// (caf/detail/init_fun_factory.hpp, init_fun_factory_helper::apply: `*args_`). Binding a
// reference through a null pointer is undefined behaviour, and UBSan reports it for every
// argument-less `system.spawn(fn)`. `spawn_fn` always passes one (empty) argument, so the
// tuple exists. Use it instead of `spawn(fn)` for every function-based actor; a spawn that
// already passes arguments (`spawn(fn, deps)`) does not need it.
#pragma once

#include <caf/all.hpp>

#include <type_traits>
#include <utility>

namespace tandem::runtime {

struct SpawnTag {};  // the one argument spawn_fn passes; carries nothing

namespace detail {
template <class F>
using spawn_self_t = typename caf::detail::tl_head<
    typename caf::detail::get_callable_trait<F>::type::arg_types>::type;
}  // namespace detail

// `fn` is `(Self* self) -> behavior` (or void), Self an actor type (event_based_actor,
// stateful_actor<S>, ...); `Os`: spawn options (caf::detached, ...). `spawner`: an
// actor_system or a local actor (self->spawn); its spawn<Os>(fn, args...) is called.
template <caf::spawn_options Os = caf::no_spawn_options, class Spawner, class F>
auto spawn_fn(Spawner& spawner, F fn) {
  using Self = detail::spawn_self_t<F>;
  static_assert(std::is_pointer_v<Self>, "spawn_fn: the function takes the actor's self pointer");
  return spawner.template spawn<Os>(
      [fn = std::move(fn)](Self self, SpawnTag) mutable { return fn(self); }, SpawnTag{});
}

}  // namespace tandem::runtime

