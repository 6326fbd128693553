"""The MLP training step of bench_interleaved.py / bench_hlo_ops.py in JAX: MLP 784-1024-1024-10,
batch 128, cross entropy, SGD momentum 0.9, jax.jit with the parameters and momentum donated."""
import jax
import jax.numpy as jnp


def _init(key, sizes):
    ps = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        k1, key = jax.random.split(key)
        ps.append((jax.random.normal(k1, (b, a)) * a ** -0.5, jnp.zeros((b,))))
    return ps


def _loss(ps, x, y):
    h = x
    for i, (w, b) in enumerate(ps):
        h = h @ w.T + b
        if i < len(ps) - 1:
            h = jax.nn.relu(h)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(h), y[:, None], 1))


def step(ps, bufs, x, y):
    loss, g = jax.value_and_grad(_loss)(ps, x, y)
    bufs = jax.tree_util.tree_map(lambda b, gi: 0.9 * b + gi, bufs, g)
    ps = jax.tree_util.tree_map(lambda p, b: p - 0.01 * b, ps, bufs)
    return ps, bufs, loss


def make():
    """(jitted step, params, momentum buffers, x, y); call as ps, bufs, loss = f(ps, bufs, x, y)."""
    ps = _init(jax.random.PRNGKey(0), [784, 1024, 1024, 10])
    bufs = jax.tree_util.tree_map(jnp.zeros_like, ps)
    x = jax.random.normal(jax.random.PRNGKey(1), (128, 784))
    y = jax.random.randint(jax.random.PRNGKey(2), (128,), 0, 10)
    return jax.jit(step, donate_argnums=(0, 1)), ps, bufs, x, y
