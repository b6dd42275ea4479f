"""joule.spec: a PyTorch nn.Module, traced with torch.fx, as a Joule model spec.

The spec is the JSON that jobs and POST /v1/estimate take (README, "model specs"): the
per-sample input shape, the layers in order, the loss. Each layer is named after the module or
op it came from ("layer1.0.conv1", "layer1.0.add"); a layer names its `inputs` only where they
are not the previous layer, and `add`, `mul` and `concat` join branches.

Every module and function of the traced graph maps to exactly one Joule layer kind, or the
trace fails with a SpecError of one line that names the module path and the op. Nothing is
approximated: an option Joule cannot express (a non-square kernel, an LSTM with dropout, a
scalar multiplication...) is an error too, since a spec that differs from the model would give
an estimate of another network.

torch is imported here only, when a spec is made.
"""

import dis
import inspect
import linecache
import math
import operator
import os
import sys

__all__ = ["SpecError", "spec"]


class SpecError(ValueError):
    """A model that Joule cannot describe; the message is one line naming the module and op."""

    def __init__(self, message):
        super().__init__(" ".join(str(message).split("\n")))


LOSSES = ("cross_entropy", "mse")
_NAME_LIMIT = 128


def spec(model, example_input, *, loss="cross_entropy", name=None):
    """Traces `model` on `example_input` into a Joule model spec (a JSON-able dict).

    `example_input` is one batch: dim 0 is the batch, the spec's input shape is the rest; an
    integer (long) tensor makes a "token" input (the model starts with an embedding). The model
    is traced in training mode (what jobs run) and run once on a copy of the input, under
    torch.no_grad and in eval mode so that batch-norm statistics are not touched, to learn
    every tensor's shape; the modules' train/eval flags are restored afterwards.

    Raises SpecError (one line) for anything Joule cannot describe exactly. Under Python 3.11
    and torch 1.13 it replaces torch.fx's Proxy.__iter__ while it traces (see _proxy_iter), so
    do not trace with torch.fx in another thread meanwhile.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise SpecError(f"joule.spec needs a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example_input, torch.Tensor):
        raise SpecError(f"example_input must be one torch.Tensor (a batch), got {type(example_input).__name__}")
    if example_input.dim() < 2:
        raise SpecError(
            f"example_input has shape {list(example_input.shape)}; give a batch: dim 0 is the batch, "
            "the rest is one sample")
    if loss not in LOSSES:
        raise SpecError(f"loss must be one of {', '.join(LOSSES)}, not {loss!r}")
    token = not (example_input.is_floating_point() or example_input.is_complex())
    if token and example_input.dtype not in (torch.int64, torch.int32):
        raise SpecError(f"example_input has dtype {example_input.dtype}; use float for features, long for token ids")

    modes = [(module, module.training) for module in model.modules()]
    traced = model
    if _leaf_handler(model) is not None or _is_torch_module(model):
        traced = _single(model)  # the root is traced through, so a lone layer needs a parent
    try:
        model.train()
        graph, tracer = _trace(traced)
        module = torch.fx.GraphModule(tracer.root, graph)
        _propagate_shapes(model, module, example_input)
    finally:
        for each, training in modes:
            each.training = training
    converter = _Converter(model, module, example_input)
    layers = converter.convert()
    model_input = {"shape": [int(d) for d in example_input.shape[1:]]}
    if token:
        model_input["dtype"] = "token"  # "float", the default, is left out as jouled leaves it out
    return {"name": name if name is not None else type(model).__name__, "input": model_input, "layers": layers,
            "loss": loss}


OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw", "rmsprop")


def optimizer_name(optimizer):
    """The name a job's ``training.optimizer`` gives a ``torch.optim`` optimizer.

    jouled's estimate adds the optimizer's step to the network's (Adam's two moments cost more
    than SGD's plain update); it knows sgd, sgd_momentum (SGD with momentum), adam, adamw and
    rmsprop. Another optimizer is a ``SpecError`` naming it, not the nearest known one.
    """
    import torch

    kind = type(optimizer)
    if kind is torch.optim.SGD:
        momentum = any(group.get("momentum", 0) for group in optimizer.param_groups)
        return "sgd_momentum" if momentum else "sgd"
    names = {torch.optim.Adam: "adam", torch.optim.AdamW: "adamw", torch.optim.RMSprop: "rmsprop"}
    if kind in names:
        return names[kind]
    raise SpecError(f"{kind.__module__}.{kind.__name__}: jouled estimates {', '.join(OPTIMIZERS)} "
                    "(torch.optim.SGD, with or without momentum, Adam, AdamW, RMSprop)")


def dumps(model_spec):
    """The spec as JSON text, one layer per line (as examples/models/*.json are written)."""
    import json

    head = {key: value for key, value in model_spec.items() if key != "layers"}
    lines = [json.dumps(layer) for layer in model_spec["layers"]]
    text = json.dumps(head)[:-1] + ', "layers": [\n  ' + ",\n  ".join(lines) + "]}\n"
    return text


# ---- tracing -------------------------------------------------------------------------------

def _is_torch_module(module):
    import torch

    kind = type(module)
    return kind.__module__.startswith(("torch.nn", "torch.ao.nn")) and \
        not isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict))


def _single(layer):
    """A parent for a model that is one torch.nn layer, its child named after its class."""
    import torch

    class Single(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module(type(layer).__name__.lower(), layer)

        def forward(self, x):
            return getattr(self, type(layer).__name__.lower())(x)

    Single.__name__ = type(layer).__name__
    return Single()


_THIS_FILE = os.path.abspath(__file__)


def _torch_dir():
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _user_frame(frame):
    """The innermost frame outside torch and this file (the model's own code), or None."""
    torch_dir = _torch_dir()
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(torch_dir) and filename != _THIS_FILE:
            return frame
        frame = frame.f_back
    return None


def _where(filename, lineno):
    code = linecache.getline(filename, lineno).strip()
    where = f"{os.path.basename(filename)}:{lineno}"
    return f"{where} (`{code}`)" if code else where


def _proxy_iter(self):
    # torch 1.13's Proxy.__iter__ finds the unpacking instruction at f_lasti // 2, which is
    # wrong under Python 3.11's inline caches (`out, _ = lstm(x)` fails or raises IndexError);
    # this finds it by its offset.
    frame = inspect.currentframe().f_back
    for instruction in dis.get_instructions(frame.f_code):
        if instruction.offset == frame.f_lasti:
            if instruction.opname == "UNPACK_SEQUENCE":
                return (self[i] for i in range(instruction.argval))
            break
    return self.tracer.iter(self)


def _make_tracer_class():
    import torch
    import torch.fx

    class Tracer(torch.fx.Tracer):
        """Traces through containers and user modules; only modules Joule knows (and the rest
        of torch.nn, so that an error can name them) are leaves. Records for every node the
        module path it was created in and the model's own source line."""

        def __init__(self):
            super().__init__()
            self.module_stack = []
            self.failed_in = None

        def is_leaf_module(self, module, qualified_name):
            kind = type(module)
            if isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)):
                return False
            if _leaf_handler(module) is not None:
                return True
            return kind.__module__.startswith("torch.nn") or kind.__module__.startswith("torch.ao.nn")

        def call_module(self, module, forward, args, kwargs):
            self.module_stack.append((self.path_of_module(module), type(module).__name__))
            try:
                return super().call_module(module, forward, args, kwargs)
            except Exception:
                if self.failed_in is None:
                    self.failed_in = self.module_stack[-1]
                raise
            finally:
                self.module_stack.pop()

        def create_node(self, *args, **kwargs):
            node = super().create_node(*args, **kwargs)
            node.meta["joule_path"] = self.module_stack[-1][0] if self.module_stack else ""
            frame = _user_frame(inspect.currentframe())
            if frame is not None:
                node.meta["joule_where"] = _where(frame.f_code.co_filename, frame.f_lineno)
            return node

    return Tracer


def _trace(model):
    import torch.fx.proxy

    tracer = _make_tracer_class()()
    # Arguments after the first that have defaults (masks, flags) keep them.
    concrete = {}
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    for parameter in parameters[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is parameter.empty:
            raise SpecError(
                f"{type(model).__name__}.forward takes more than one input ({parameter.name}); "
                "joule.spec traces models of one input tensor")
        concrete[parameter.name] = parameter.default
    patched = sys.version_info >= (3, 11) and torch.fx.proxy.Proxy.__iter__ is not _proxy_iter
    original_iter = torch.fx.proxy.Proxy.__iter__
    if patched:
        torch.fx.proxy.Proxy.__iter__ = _proxy_iter
    try:
        graph = tracer.trace(model, concrete_args=concrete or None)
    except SpecError:
        raise
    except Exception as error:  # noqa: BLE001 - every trace failure becomes one line
        raise SpecError(_trace_failure(model, tracer, error)) from None
    finally:
        if patched:
            torch.fx.proxy.Proxy.__iter__ = original_iter
    return graph, tracer


def _trace_failure(model, tracer, error):
    frames = []
    traceback = error.__traceback__
    torch_dir = _torch_dir()
    while traceback is not None:
        filename = os.path.abspath(traceback.tb_frame.f_code.co_filename)
        if not filename.startswith(torch_dir) and filename != _THIS_FILE:
            frames.append((filename, traceback.tb_lineno))
        traceback = traceback.tb_next
    text = str(error).strip().split("\n")[0]
    if "cannot be used as inputs to control flow" in text:
        reason = ("its forward branches on a tensor's value (data-dependent control flow), which no fixed "
                  "graph describes")
    elif "cannot be iterated" in text:
        reason = "its forward iterates over a tensor, which no fixed graph describes"
    else:
        reason = f"{type(error).__name__}: {text}"
    where = f" at {_where(*frames[-1])}" if frames else ""
    module = ""
    if tracer.failed_in is not None:
        path, kind = tracer.failed_in
        module = f" in module {path or '(the model)'} ({kind})"
    return f"cannot trace {type(model).__name__}{module}: {reason}{where}"


def _propagate_shapes(model, module, example_input):
    """Runs the traced graph once, noting each node's result type and, for tensors, shape."""
    import torch
    import torch.fx

    class Recording(torch.fx.Interpreter):
        current = None

        def run_node(self, node):
            self.current = node
            result = super().run_node(node)
            node.meta["joule_type"] = type(result)
            if isinstance(result, torch.Tensor):
                node.meta["joule_shape"] = tuple(int(d) for d in result.shape)
            return result

    propagation = Recording(module)
    module.eval()
    try:
        with torch.no_grad():
            propagation.run(example_input.clone())
    except Exception as error:  # noqa: BLE001 - the model's own failure, in one line
        node = propagation.current
        where = ""
        if node is not None and node.op == "call_module":
            where = f" in module {node.target} ({type(module.get_submodule(node.target)).__name__})"
        elif node is not None and node.op in ("call_function", "call_method"):
            path = node.meta.get("joule_path", "")
            where = f" in {_op_name(node.target)}" + (f" in module {path}" if path else "")
            where += f" at {node.meta['joule_where']}" if node.meta.get("joule_where") else ""
        text = str(error).strip().split("\n")[0]
        raise SpecError(f"{type(model).__name__} fails on the example input {list(example_input.shape)}{where}: "
                        f"{type(error).__name__}: {text}") from None


# ---- modules: each handler gets the converter, the call_module node, the module and the
# ---- input value, and returns the value the node stands for ---------------------------------

def _pair(value, what, where):
    """An int, or a tuple of equal ints, as one int (Joule's kernels, strides... are square)."""
    if isinstance(value, (tuple, list)):
        if len(set(value)) != 1:
            raise SpecError(f"{where}: {what} {tuple(value)} is not square; Joule's layers take one int for every "
                            "spatial dim")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(f"{where}: {what} {value!r} is not a constant int")
    return value


def _simple(kind):
    def handler(converter, node, module, x):
        return converter.emit(node, kind, {}, [x])
    return handler


def _hardtanh(converter, node, module, x):
    if (module.min_val, module.max_val) == (0.0, 6.0):
        return converter.emit(node, "relu6", {}, [x])
    raise SpecError(f"{converter.module_where(node)}: Hardtanh({module.min_val}, {module.max_val}) has no Joule layer "
                    "kind (only Hardtanh(0, 6), which is relu6)")


def _gelu(converter, node, module, x):
    if module.approximate != "none":
        raise SpecError(f"{converter.module_where(node)}: approximate={module.approximate!r} has no Joule layer kind "
                        "(Joule's gelu is the exact erf form)")
    return converter.emit(node, "gelu", {}, [x])


def _leaky_relu(converter, node, module, x):
    return converter.emit(node, "leaky_relu", {"negative_slope": float(module.negative_slope)}, [x])


def _elu(converter, node, module, x):
    return converter.emit(node, "elu", {"alpha": float(module.alpha)}, [x])


def _softplus(converter, node, module, x):
    return converter.emit(node, "softplus", _softplus_args(module.beta, module.threshold,
                                                           converter.module_where(node)), [x])


def _softplus_args(beta, threshold, where):
    if not isinstance(beta, (int, float)) or not isinstance(threshold, (int, float)) or beta <= 0:
        raise SpecError(f"{where}: softplus takes a constant beta > 0 and threshold here, got beta={beta!r}, "
                        f"threshold={threshold!r}")
    return {"beta": float(beta), "threshold": float(threshold)}


def _conv(converter, node, module, x):
    import torch.nn as nn

    where = converter.module_where(node)
    kind, rank = ("conv2d", 4) if isinstance(module, nn.Conv2d) else ("conv1d", 3)
    converter.expect_rank(node, rank, where)
    if module.padding_mode != "zeros":
        raise SpecError(f"{where}: padding_mode={module.padding_mode!r} has no Joule equivalent (zeros only)")
    kernel = _pair(module.kernel_size, "kernel_size", where)
    stride = _pair(module.stride, "stride", where)
    dilation = _pair(module.dilation, "dilation", where)
    padding = module.padding
    if padding == "valid":
        padding = 0
    elif padding == "same":
        if (dilation * (kernel - 1)) % 2:
            raise SpecError(f"{where}: padding='same' with an even kernel pads one side more; Joule pads both sides "
                            "alike")
        padding = dilation * (kernel - 1) // 2
    padding = _pair(padding, "padding", where)
    args = {"out_channels": module.out_channels, "kernel_size": kernel}
    if stride != 1:
        args["stride"] = stride
    if padding != 0:
        args["padding"] = padding
    if dilation != 1:
        args["dilation"] = dilation
    if module.groups != 1:
        args["groups"] = module.groups
    if module.bias is None:
        args["bias"] = False
    return converter.emit(node, kind, args, [x])


def _linear(converter, node, module, x):
    args = {"out_features": module.out_features}
    if module.bias is None:
        args["bias"] = False
    return converter.emit(node, "linear", args, [x])


def _softmax_module(converter, node, module, x):
    dim = converter.sample_dim(node, module.dim, converter.module_where(node))
    return converter.emit(node, "softmax", {"dim": dim}, [x])


def _pool_args(where, kernel, stride, padding, fixed):
    """Joule's pooling arguments; `fixed` lists (option, value, the only value Joule has)."""
    kernel = _pair(kernel, "kernel_size", where)
    stride = kernel if stride is None or stride in ([], ()) else _pair(stride, "stride", where)
    padding = _pair(padding, "padding", where)
    for key, value, only in fixed:
        if value != only:
            raise SpecError(f"{where}: {key}={value!r} has no Joule equivalent (only {key}={only!r})")
    args = {"kernel_size": kernel}
    if stride != kernel:
        args["stride"] = stride
    if padding != 0:
        args["padding"] = padding
    return args


def _pool_module(converter, node, module, x):
    import torch.nn as nn

    where = converter.module_where(node)
    converter.expect_rank(node, 4, where)
    if isinstance(module, nn.MaxPool2d):
        fixed = [("dilation", _pair(module.dilation, "dilation", where), 1), ("ceil_mode", module.ceil_mode, False),
                 ("return_indices", module.return_indices, False)]
        args = _pool_args(where, module.kernel_size, module.stride, module.padding, fixed)
        return converter.emit(node, "maxpool2d", args, [x])
    fixed = [("ceil_mode", module.ceil_mode, False), ("divisor_override", module.divisor_override, None)]
    if _pair(module.padding, "padding", where) != 0:
        fixed.append(("count_include_pad", module.count_include_pad, True))
    args = _pool_args(where, module.kernel_size, module.stride, module.padding, fixed)
    return converter.emit(node, "avgpool2d", args, [x])


def _adaptive_args(where, output_size):
    if isinstance(output_size, (tuple, list)) and None in output_size:
        raise SpecError(f"{where}: output_size {tuple(output_size)} keeps an input dim; Joule's adaptive_avgpool2d "
                        "takes one int")
    return {"output_size": _pair(output_size, "output_size", where)}


def _adaptive_module(converter, node, module, x):
    where = converter.module_where(node)
    converter.expect_rank(node, 4, where)
    return converter.emit(node, "adaptive_avgpool2d", _adaptive_args(where, module.output_size), [x])


def _batchnorm(converter, node, module, x):
    import torch.nn as nn

    where = converter.module_where(node)
    if not module.affine:
        raise SpecError(f"{where}: affine=False (no weight and bias) has no Joule equivalent")
    if isinstance(module, nn.BatchNorm2d):
        converter.expect_rank(node, 4, where)
        return converter.emit(node, "batchnorm2d", {}, [x])
    shape = converter.in_shape(node)
    if len(shape) not in (2, 3):
        raise SpecError(f"{where}: BatchNorm1d of a {list(shape)} batch; Joule's batchnorm1d takes [N, C] or "
                        "[N, C, L]")
    return converter.emit(node, "batchnorm1d", {}, [x])


def _layernorm_problem(module, shape):
    if tuple(module.normalized_shape) != (shape[-1],):
        return (f"LayerNorm over {tuple(module.normalized_shape)} of a {list(shape)} batch; Joule's layernorm "
                "normalises the last dim only")
    if not module.elementwise_affine or getattr(module, "bias", True) is None:
        return "a LayerNorm without weight or bias has no Joule equivalent"
    return None


def _layernorm(converter, node, module, x):
    problem = _layernorm_problem(module, converter.in_shape(node))
    if problem:
        raise SpecError(f"{converter.module_where(node)}: {problem}")
    return converter.emit(node, "layernorm", {}, [x])


def _dropout_module(converter, node, module, x):
    return converter.emit(node, "dropout", {"p": float(module.p)}, [x])


def _flatten_module(converter, node, module, x):
    converter.check_flatten(node, module.start_dim, module.end_dim, converter.module_where(node))
    return converter.emit(node, "flatten", {}, [x])


def _embedding(converter, node, module, x):
    where = converter.module_where(node)
    for key, only in (("max_norm", None), ("scale_grad_by_freq", False), ("sparse", False)):
        if getattr(module, key) != only:
            raise SpecError(f"{where}: {key}={getattr(module, key)!r} has no Joule equivalent")
    args = {"num_embeddings": module.num_embeddings, "embedding_dim": module.embedding_dim}
    return converter.emit(node, "embedding", args, [x])


def _rnn(converter, node, module, x):
    import torch.nn as nn

    where = converter.module_where(node)
    kind = "lstm" if isinstance(module, nn.LSTM) else "gru"
    if len(node.args) > 1 or any(value is not None for value in node.kwargs.values()):
        raise SpecError(f"{where}: called with an initial state; Joule's {kind} starts from zeros")
    if not module.batch_first:
        raise SpecError(f"{where}: batch_first=False; Joule's specs put the batch first (batch_first=True)")
    for key, value, only in (("bias", module.bias, True), ("proj_size", getattr(module, "proj_size", 0), 0),
                             ("dropout", module.dropout, 0.0)):
        if value != only:
            raise SpecError(f"{where}: {key}={value!r} has no Joule equivalent (Joule's {kind} has {key}={only!r})")
    converter.expect_rank(node, 3, where)
    mode, outputs = converter.rnn_outputs(node, module, kind == "lstm")
    args = {"hidden_size": module.hidden_size}
    if module.num_layers != 1:
        args["num_layers"] = module.num_layers
    args["output"] = mode
    if module.bidirectional:
        args["bidirectional"] = True
    name = converter.emit(node, kind, args, [x])
    for output in outputs:
        converter.values[output] = _Value("tensor", name)
    return _Value("structure")


def _attention(converter, node, module, x):
    where = converter.module_where(node)
    operands = list(node.args[:3]) + [node.kwargs.get(key) for key in ("query", "key", "value")[len(node.args):]]
    if not (operands[0] is operands[1] is operands[2]):
        raise SpecError(f"{where}: query, key and value differ; Joule's multihead_attention is self-attention")
    for key, value in list(node.kwargs.items()) + list(zip(("key_padding_mask", "need_weights", "attn_mask"),
                                                          node.args[3:])):
        if key not in ("query", "key", "value", "need_weights", "average_attn_weights") and value is not None:
            raise SpecError(f"{where}: called with {key}; Joule's multihead_attention takes no masks")
    if not module.batch_first:
        raise SpecError(f"{where}: batch_first=False; Joule's specs put the batch first (batch_first=True)")
    if module.dropout != 0.0 or module.bias_k is not None or module.add_zero_attn or \
            not module._qkv_same_embed_dim or module.in_proj_bias is None:
        raise SpecError(f"{where}: only MultiheadAttention(embed_dim, num_heads, batch_first=True) with the default "
                        "dropout, bias, kdim and vdim has a Joule kind")
    converter.expect_rank(node, 3, where)
    output = converter.tuple_output(node, where, "attention weights")
    name = converter.emit(node, "multihead_attention", {"num_heads": module.num_heads}, [x])
    if output is not None:
        converter.values[output] = _Value("tensor", name)
    return _Value("structure")


def _encoder_layer_args(where, layer):
    import torch.nn as nn
    import torch.nn.functional as F

    problems = []
    if not layer.self_attn.batch_first:
        problems.append("batch_first=False")
    activation = layer.activation
    if activation is F.relu or isinstance(activation, nn.ReLU):
        gelu = False
    elif activation is F.gelu or (isinstance(activation, nn.GELU) and activation.approximate == "none"):
        gelu = True
    else:
        name = getattr(activation, "__name__", None) or repr(activation)
        problems.append(f"activation {name} (only relu and the exact gelu)")
    if layer.dropout.p != 0.1:
        problems.append(f"dropout={layer.dropout.p}")
    if layer.linear1.bias is None or layer.self_attn.in_proj_bias is None:
        problems.append("bias=False")
    if problems:
        raise SpecError(f"{where}: {', '.join(problems)}; Joule's transformer_encoder_layer is torch's "
                        "(batch_first=True, dropout 0.1, relu or gelu, post-norm or norm_first)")
    args = {"nhead": layer.self_attn.num_heads, "dim_feedforward": layer.linear1.out_features}
    if layer.norm_first:
        args["norm_first"] = True
    if gelu:
        args["activation"] = "gelu"
    return args


def _encoder_layer(converter, node, module, x):
    where = converter.module_where(node)
    converter.no_masks(node, where)
    converter.expect_rank(node, 3, where)
    return converter.emit(node, "transformer_encoder_layer", _encoder_layer_args(where, module), [x])


def _encoder(converter, node, module, x):
    # nn.TransformerEncoder's forward is fast-path checks and a loop over its layers: the
    # layers (and the final norm) are the spec.
    where = converter.module_where(node)
    converter.no_masks(node, where)
    converter.expect_rank(node, 3, where)
    for index, layer in enumerate(module.layers):
        path = f"{node.target}.layers.{index}"
        layer_where = f"module {path} ({type(layer).__name__})"
        if _leaf_handler(layer) is not _encoder_layer:
            raise SpecError(f"{layer_where}: only nn.TransformerEncoderLayer has a Joule kind here")
        name = converter.emit(node, "transformer_encoder_layer", _encoder_layer_args(layer_where, layer), [x], name=path)
        x = _Value("tensor", name)
    if module.norm is not None:
        norm_where = f"module {node.target}.norm ({type(module.norm).__name__})"
        problem = "only a LayerNorm has a Joule kind here" if _leaf_handler(module.norm) is not _layernorm \
            else _layernorm_problem(module.norm, converter.in_shape(node))
        if problem:
            raise SpecError(f"{norm_where}: {problem}")
        x = _Value("tensor", converter.emit(node, "layernorm", {}, [x], name=f"{node.target}.norm"))
    return x


def _leaf_kinds():
    """(module class, handler) for the modules that are leaves of the trace, most specific first."""
    global _LEAF_KINDS
    if _LEAF_KINDS is None:
        import torch.nn as nn

        _LEAF_KINDS = [
            (nn.Conv2d, _conv), (nn.Conv1d, _conv), (nn.Linear, _linear),
            (nn.ReLU, _simple("relu")), (nn.ReLU6, _simple("relu6")), (nn.Hardtanh, _hardtanh),
            (nn.GELU, _gelu), (nn.Tanh, _simple("tanh")), (nn.Sigmoid, _simple("sigmoid")),
            (nn.SiLU, _simple("silu")), (nn.Hardswish, _simple("hardswish")), (nn.Identity, _simple("identity")),
            (nn.LeakyReLU, _leaky_relu), (nn.ELU, _elu), (nn.Softplus, _softplus), (nn.Mish, _simple("mish")),
            (nn.Softmax, _softmax_module), (nn.MaxPool2d, _pool_module), (nn.AvgPool2d, _pool_module),
            (nn.AdaptiveAvgPool2d, _adaptive_module), (nn.BatchNorm2d, _batchnorm), (nn.BatchNorm1d, _batchnorm),
            (nn.LayerNorm, _layernorm), (nn.Dropout, _dropout_module), (nn.Flatten, _flatten_module),
            (nn.Embedding, _embedding), (nn.LSTM, _rnn), (nn.GRU, _rnn),
            (nn.MultiheadAttention, _attention), (nn.TransformerEncoderLayer, _encoder_layer),
            (nn.TransformerEncoder, _encoder),
        ]
    return _LEAF_KINDS


_LEAF_KINDS = None


def _leaf_handler(module):
    for kind, handler in _leaf_kinds():
        # A subclass with a forward of its own computes something else: it is traced through.
        if type(module) is kind or (isinstance(module, kind) and type(module).forward is kind.forward):
            return handler
    return None


# ---- functions and methods -----------------------------------------------------------------

def _function_table():
    """fx targets (functions, or method names) → what they are to the spec."""
    global _FUNCTIONS
    if _FUNCTIONS is None:
        import torch
        import torch.nn.functional as F

        table = {
            operator.add: "add", operator.iadd: "add", torch.add: "add", "add": "add", "add_": "add",
            operator.mul: "mul", operator.imul: "mul", torch.mul: "mul", "mul": "mul", "mul_": "mul",
            torch.cat: "concat", torch.flatten: "flatten", "flatten": "flatten",
            "view": "reshape", "reshape": "reshape", torch.reshape: "reshape",
            F.relu: "relu", torch.relu: "relu", "relu": "relu", "relu_": "relu", F.relu_: "relu",
            F.relu6: "relu6", F.hardtanh: "hardtanh", F.gelu: "gelu",
            torch.tanh: "tanh", "tanh": "tanh", F.tanh: "tanh",
            torch.sigmoid: "sigmoid", "sigmoid": "sigmoid", F.sigmoid: "sigmoid",
            F.silu: "silu", F.hardswish: "hardswish", F.mish: "mish",
            F.leaky_relu: "leaky_relu", F.leaky_relu_: "leaky_relu", F.elu: "elu", F.elu_: "elu",
            F.softplus: "softplus",
            F.softmax: "softmax", torch.softmax: "softmax", "softmax": "softmax",
            F.dropout: "dropout", F.adaptive_avg_pool2d: "adaptive_avgpool2d",
            F.max_pool2d: "maxpool2d", F.avg_pool2d: "avgpool2d",
            torch.mean: "mean", "mean": "mean", "contiguous": "alias",
            # Sizes, for shapes only.
            getattr: "shape", "size": "shape", "dim": "shape", "numel": "shape",
        }
        # fx's check that an argument traced as None (forward(x, mask=None)) stays None.
        assert_is_none = getattr(torch.fx._symbolic_trace, "_assert_is_none", None)
        if assert_is_none is not None:
            table[assert_is_none] = "shape"
        if hasattr(torch, "concat"):
            table[torch.concat] = "concat"
        _FUNCTIONS = table
    return _FUNCTIONS


_FUNCTIONS = None
_PUBLIC_NAMES = None


def _op_name(target):
    """How a user writes the op: "torch.fft.fft2", "operator.mul", "Tensor.view"."""
    global _PUBLIC_NAMES
    if isinstance(target, str):
        return f"Tensor.{target}"
    if _PUBLIC_NAMES is None:
        import builtins

        import torch
        import torch.nn.functional as F

        spaces = [("operator", operator), ("math", math), ("builtins", builtins), ("torch", torch),
                  ("torch.nn.functional", F)]
        spaces += [(f"torch.{space}", getattr(torch, space)) for space in ("fft", "linalg", "special")
                   if hasattr(torch, space)]
        names = {}
        for prefix, namespace in reversed(spaces):  # the first namespace that has it names it
            for key, value in vars(namespace).items():
                if callable(value) and not key.startswith("_") and _hashable(value):
                    names[value] = f"{prefix}.{key}"
        _PUBLIC_NAMES = names
    if _hashable(target) and target in _PUBLIC_NAMES:
        return _PUBLIC_NAMES[target]
    module = getattr(target, "__module__", None) or "?"
    return f"{module}.{getattr(target, '__qualname__', getattr(target, '__name__', repr(target)))}"


def _hashable(target):
    try:
        hash(target)
        return True
    except TypeError:
        return False


def _argument(node, index, key, default):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(key, default)


def _index_text(index):
    def one(item):
        if isinstance(item, slice):
            text = ":".join("" if part is None else str(part) for part in (item.start, item.stop))
            return text + (f":{item.step}" if item.step is not None else "")
        return "..." if item is Ellipsis else str(item)

    items = index if isinstance(index, tuple) else (index,)
    return "[" + ", ".join(one(item) for item in items) + "]"


def _is_getitem(node, index=None):
    return node.op == "call_function" and node.target is operator.getitem and \
        (index is None or (not isinstance(node.args[1], (tuple, slice)) and node.args[1] == index))


# ---- the conversion ------------------------------------------------------------------------

class _Value:
    """What an fx node is to the spec: a tensor made by a layer ("tensor"; ref: the layer's name,
    or "input"), a parameter or buffer read directly ("parameter"; ref: its name), a non-tensor
    used for shapes ("other"), or part of a layer's tuple output already accounted for
    ("structure")."""

    __slots__ = ("kind", "ref")

    def __init__(self, kind, ref=None):
        self.kind = kind
        self.ref = ref


class _Converter:
    """Walks the traced graph in order and emits one Joule layer per op."""

    def __init__(self, model, module, example_input):
        self.model = model
        self.module = module
        self.batch = int(example_input.shape[0])
        self.values = {}          # fx node -> _Value
        self.layers = []
        self.names = set()
        self.used = set()         # layer names some later layer takes
        self.last = "input"       # the previous layer: the default input of the next
        self.node_of_layer = {}
        self.modules_called = set()

    # -- where, shapes, checks --

    def model_name(self):
        return type(self.model).__name__

    def module_where(self, node):
        return f"module {node.target} ({type(self.module.get_submodule(node.target)).__name__})"

    def fn_where(self, node, op=None):
        op = op or _op_name(node.target)
        path = node.meta.get("joule_path", "")
        inside = f"module {path}" if path else f"{self.model_name()}.forward"
        where = node.meta.get("joule_where")
        return f"{op} in {inside}" + (f" at {where}" if where else "")

    def where(self, node):
        return self.module_where(node) if node.op == "call_module" else self.fn_where(node)

    def shape(self, node):
        return node.meta.get("joule_shape")

    def in_shape(self, node):
        first = node.args[0] if node.args else next(iter(node.kwargs.values()), None)
        return self.shape(first) if hasattr(first, "op") else None

    def expect_rank(self, node, rank, where):
        shape = self.in_shape(node)
        if shape is None or len(shape) != rank:
            raise SpecError(f"{where}: expects a batch of {rank} dims (the batch first), got {list(shape or [])}")

    def sample_dim(self, node, dim, where, rank=None):
        """A dim of the batch tensor as a dim of one sample (the batch is dim 0)."""
        rank = rank if rank is not None else len(self.in_shape(node))
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise SpecError(f"{where}: dim {dim!r} is not given as a constant int; name the dim (the batch is dim 0)")
        if dim == 0 or dim == -rank:
            raise SpecError(f"{where}: dim {dim} is the batch dim; Joule layers work within a sample")
        return dim - 1 if dim > 0 else dim

    def check_flatten(self, node, start, end, where):
        rank = len(self.in_shape(node))
        start, end = (start + rank if start < 0 else start), (end + rank if end < 0 else end)
        if start != 1 or end != rank - 1:
            raise SpecError(f"{where}: flattens dims {start}..{end} of a {rank}-dim batch; Joule's flatten joins all "
                            "dims of a sample (start_dim=1, end_dim=-1)")

    def no_masks(self, node, where):
        if any(value is not None for value in list(node.args[1:]) + list(node.kwargs.values())):
            raise SpecError(f"{where}: called with a mask; Joule's encoder layers take no masks")

    def tuple_output(self, node, where, what_else):
        """For a module returning (output, extra): the getitem [0] node that is used, if any."""
        output = None
        for user in list(node.users):
            if not (_is_getitem(user, 0) or _is_getitem(user, 1)):
                raise SpecError(f"{where}: its tuple output is used whole; unpack it (out, _ = ...)")
            self.values[user] = _Value("structure")
            if _is_getitem(user, 0):
                output = user
            elif user.users:
                raise SpecError(f"{where}: uses the {what_else} (its output [1]), which Joule does not model")
        return output

    def rnn_outputs(self, node, module, lstm):
        """Whether the network takes the whole output sequence of an LSTM/GRU or its last step,
        and the fx nodes that stand for the layer's output."""
        where = self.module_where(node)
        kind = "lstm" if lstm else "gru"
        last, whole = [], []
        full = slice(None, None, None)

        def is_last_step(user):
            index = user.args[1] if _is_getitem(user) else None
            return isinstance(index, tuple) and len(index) in (2, 3) and index[0] == full and \
                index[1] == -1 and (len(index) == 2 or index[2] in (full, Ellipsis))

        def final_hidden(h_n):
            self.values[h_n] = _Value("structure")
            if h_n.users and module.bidirectional:
                # h_n[-1] is the reverse direction's state after the whole sequence (at step 0).
                raise SpecError(f"{where}: uses the final hidden state h_n of a bidirectional {kind}, which Joule "
                                "does not model; take the output's last step (out[:, -1]: both directions) or the "
                                "whole output sequence")
            for user in h_n.users:
                if _is_getitem(user, -1) or _is_getitem(user, module.num_layers - 1):
                    last.append(user)
                else:
                    raise SpecError(f"{where}: uses the final hidden state h_n other than h_n[-1] (the last layer's), "
                                    "which Joule does not model")

        for user in list(node.users):
            if not (_is_getitem(user, 0) or _is_getitem(user, 1)):
                raise SpecError(f"{where}: its (output, state) tuple is used whole; unpack it (out, _ = rnn(x))")
            self.values[user] = _Value("structure")
            if _is_getitem(user, 0):
                steps = [use for use in user.users if is_last_step(use)]
                last.extend(steps)
                if len(steps) < len(user.users):
                    whole.append(user)  # with any steps: the "both" error below
            elif not lstm:
                final_hidden(user)
            else:
                for state in user.users:
                    if not (_is_getitem(state, 0) or _is_getitem(state, 1)):
                        raise SpecError(f"{where}: its (h_n, c_n) state is used whole, which Joule does not model")
                    self.values[state] = _Value("structure")
                    if _is_getitem(state, 0):
                        final_hidden(state)
                    elif state.users:
                        raise SpecError(f"{where}: uses the cell state c_n, which Joule does not model")
        if whole and last:
            raise SpecError(f"{where}: uses both the whole output sequence and its last step; Joule's {kind} gives "
                            "one of them (output \"sequence\" or \"last\")")
        if whole:
            return "sequence", whole
        if last:
            return "last", last
        raise SpecError(f"{where}: its output is never used")

    # -- emitting layers --

    def unique_name(self, base):
        if len(base) > _NAME_LIMIT - 8:
            base = base[-(_NAME_LIMIT - 8):].lstrip(".")
        name, count = base, 0
        while name in self.names or name == "input":
            count += 1
            name = f"{base}:{count}"
        self.names.add(name)
        return name

    def emit(self, node, kind, args, inputs, name=None):
        refs = []
        for value in inputs:
            if not isinstance(value, _Value) or value.kind != "tensor":
                raise AssertionError(f"a {kind} layer's input is not a tensor")
            refs.append(value.ref)
        if name is None:
            if node.op == "call_module":
                name = node.target
            else:
                path = node.meta.get("joule_path", "")
                op = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "op")
                op = op.strip("_") or "op"
                name = f"{path}.{op}" if path else op
        name = self.unique_name(name)
        layer = {"type": kind, "name": name}
        if kind in ("add", "mul", "concat") or refs != [self.last]:
            layer["inputs"] = refs
        layer.update(args)
        self.layers.append(layer)
        self.used.update(refs)
        self.node_of_layer[name] = node
        self.last = name
        return name

    def tensor(self, node, arg, where):
        """The tensor value of an fx argument, or a SpecError saying what it is instead."""
        if not hasattr(arg, "op"):
            raise SpecError(f"{where}: takes a constant ({arg!r}) where Joule needs a tensor computed from the input")
        value = self.values.get(arg)
        if value is not None and value.kind == "parameter":
            if value.ref.startswith("_tensor_constant"):
                raise SpecError(f"{where}: takes a tensor made while tracing (a constant), not computed from the "
                                "input; Joule has no kind for arithmetic with constants")
            raise SpecError(f"{where}: uses the parameter or buffer {value.ref} directly; Joule knows parameters only "
                            "inside the modules it maps (nn.Linear, nn.Conv2d, ...)")
        if value is None or value.kind != "tensor":
            raise SpecError(f"{where}: takes {arg.name}, which is not a tensor computed from the input")
        return value

    # -- the walk --

    def convert(self):
        output = None
        for node in self.module.graph.nodes:
            if node in self.values:
                continue  # part of an LSTM's or attention's tuple output, already resolved
            if node.op == "placeholder":
                # The first is the input; the others are arguments traced as their defaults.
                first = not any(value.kind == "tensor" and value.ref == "input" for value in self.values.values())
                self.values[node] = _Value("tensor", "input") if first else _Value("other")
            elif node.op == "get_attr":
                self.values[node] = _Value("parameter", node.target)
            elif node.op == "output":
                output = node
            elif node.op == "call_module":
                self.values[node] = self.call_module(node)
            else:
                self.values[node] = self.call_function(node)
        return self.finish(output)

    def call_module(self, node):
        module = self.module.get_submodule(node.target)
        handler = _leaf_handler(module)
        where = self.module_where(node)
        if handler is None:
            kind = type(module)
            shown = f"nn.{kind.__name__}" if kind.__module__.startswith("torch.nn") else \
                f"{kind.__module__}.{kind.__name__}"
            raise SpecError(f"{where}: no Joule layer kind for {shown}")
        if node.target in self.modules_called and any(True for _ in module.parameters()):
            raise SpecError(f"{where}: called twice, sharing its weights; a Joule spec gives each layer parameters "
                            "of its own")
        self.modules_called.add(node.target)
        if not node.args:
            raise SpecError(f"{where}: called without a positional input")
        x = self.tensor(node, node.args[0], where)
        result = handler(self, node, module, x)
        return result if isinstance(result, _Value) else _Value("tensor", result)

    def call_function(self, node):
        import torch

        op = _function_table().get(node.target) if _hashable(node.target) else None
        where = self.fn_where(node)
        args = [arg for arg in list(node.args) + list(node.kwargs.values())]
        flat = []
        for arg in args:
            flat.extend(arg if isinstance(arg, (list, tuple)) else [arg])
        tensors_in = [arg for arg in flat if hasattr(arg, "op") and self.values.get(arg, _Value("other")).kind
                      in ("tensor", "parameter")]
        result_type = node.meta.get("joule_type")
        is_tensor = isinstance(result_type, type) and issubclass(result_type, torch.Tensor)
        if not is_tensor:
            # Sizes and arithmetic on them feed shapes (x.view(x.size(0), -1)); a layer that
            # gets one where it needs a tensor says so.
            if not tensors_in or op == "shape":
                return _Value("other")
            if node.target is operator.getitem:
                raise SpecError(f"{self.fn_where(node, 'indexing ' + _index_text(node.args[1]))}: no Joule layer kind "
                                "for it")
            raise SpecError(f"{where}: no Joule layer kind for it")
        for arg in tensors_in:
            if self.values[arg].kind == "parameter":
                self.tensor(node, arg, where)  # raises, naming the parameter
        if op is None or op == "shape":
            if node.target is operator.getitem:
                raise SpecError(f"{self.fn_where(node, 'indexing ' + _index_text(node.args[1]))}: no Joule layer kind "
                                "for indexing or slicing a tensor")
            raise SpecError(f"{where}: no Joule layer kind for it")
        if not tensors_in:
            raise SpecError(f"{where}: makes a tensor that is not computed from the input, which Joule does not model")
        if op in ("add", "mul"):
            return self.join(node, op, where)
        if op == "concat":
            return self.concat(node, where)
        x = self.tensor(node, node.args[0] if node.args else None, where)
        if op == "alias":
            return x
        if op == "flatten":
            self.check_flatten(node, _argument(node, 1, "start_dim", 0), _argument(node, 2, "end_dim", -1), where)
            return self.layer(node, "flatten", {}, x)
        if op == "reshape":
            before, after = self.in_shape(node), self.shape(node)
            if before == after:
                return x
            if len(after) == 2 and after[0] == before[0] and after[1] == math.prod(before[1:]):
                return self.layer(node, "flatten", {}, x)
            raise SpecError(f"{where}: reshapes {list(before)} to {list(after)}; Joule has a kind only for flattening "
                            "each sample (x.view(x.size(0), -1))")
        if op in ("relu", "relu6", "tanh", "sigmoid", "silu", "hardswish", "mish"):
            return self.layer(node, op, {}, x)
        if op == "leaky_relu":
            slope = _argument(node, 1, "negative_slope", 0.01)
            if not isinstance(slope, (int, float)):
                raise SpecError(f"{where}: negative_slope must be a constant number, got {slope!r}")
            return self.layer(node, op, {"negative_slope": float(slope)}, x)
        if op == "elu":
            alpha = _argument(node, 1, "alpha", 1.0)
            if not isinstance(alpha, (int, float)):
                raise SpecError(f"{where}: alpha must be a constant number, got {alpha!r}")
            return self.layer(node, op, {"alpha": float(alpha)}, x)
        if op == "softplus":
            return self.layer(node, op, _softplus_args(_argument(node, 1, "beta", 1), _argument(node, 2, "threshold", 20),
                                                       where), x)
        if op == "hardtanh":
            bounds = (_argument(node, 1, "min_val", -1.0), _argument(node, 2, "max_val", 1.0))
            if bounds != (0.0, 6.0):
                raise SpecError(f"{where}: hardtanh{bounds} has no Joule layer kind (only hardtanh(0, 6), relu6)")
            return self.layer(node, "relu6", {}, x)
        if op == "gelu":
            if _argument(node, 1, "approximate", "none") != "none":
                raise SpecError(f"{where}: approximate={_argument(node, 1, 'approximate', 'none')!r} has no Joule "
                                "layer kind (Joule's gelu is the exact erf form)")
            return self.layer(node, "gelu", {}, x)
        if op == "softmax":
            return self.layer(node, "softmax", {"dim": self.sample_dim(node, _argument(node, 1, "dim", None), where)}, x)
        if op == "dropout":
            p, training = _argument(node, 1, "p", 0.5), _argument(node, 2, "training", True)
            if not isinstance(p, (int, float)) or not isinstance(training, bool):
                raise SpecError(f"{where}: p and training must be constants")
            if not training:
                return x  # dropout(training=False) in training mode: the identity
            return self.layer(node, "dropout", {"p": float(p)}, x)
        if op == "adaptive_avgpool2d":
            self.expect_rank(node, 4, where)
            return self.layer(node, op, _adaptive_args(where, _argument(node, 1, "output_size", None)), x)
        if op in ("maxpool2d", "avgpool2d"):
            return self.pool(node, op, x, where)
        if op == "mean":
            return self.mean(node, x, where)
        raise AssertionError(op)

    def layer(self, node, kind, args, x):
        return _Value("tensor", self.emit(node, kind, args, [x]))

    def join(self, node, op, where):
        operands = list(node.args[:2]) + [node.kwargs.get("other")][:max(0, 2 - len(node.args))]
        if node.kwargs.get("alpha", 1) != 1:
            raise SpecError(f"{where}: alpha={node.kwargs['alpha']} has no Joule equivalent")
        verb = "adds" if op == "add" else "multiplies by"
        for operand in operands:
            if not hasattr(operand, "op"):
                raise SpecError(f"{where}: {verb} a constant ({operand!r}); Joule's {op} joins two tensors and has no "
                                "kind for arithmetic with a scalar")
        values = [self.tensor(node, operand, where) for operand in operands]
        shapes = [self.shape(operand) for operand in operands]
        if len({len(shape) for shape in shapes}) != 1:
            raise SpecError(f"{where}: joins a {list(shapes[0])} and a {list(shapes[1])} batch; broadcasting tensors "
                            "of different ranks mixes the batch dim with a sample's")
        return _Value("tensor", self.emit(node, op, {}, values))

    def concat(self, node, where):
        tensors = _argument(node, 0, "tensors", None)
        if not isinstance(tensors, (list, tuple)) or len(tensors) < 2:
            raise SpecError(f"{where}: concatenates fewer than two tensors")
        values = [self.tensor(node, each, where) for each in tensors]
        ranks = {len(self.shape(each)) for each in tensors}
        if len(ranks) != 1:
            raise SpecError(f"{where}: concatenates tensors of different ranks")
        dim = self.sample_dim(node, _argument(node, 1, "dim", 0), where, rank=ranks.pop())
        return _Value("tensor", self.emit(node, "concat", {"dim": dim}, values))

    def pool(self, node, op, x, where):
        self.expect_rank(node, 4, where)
        kernel = _argument(node, 1, "kernel_size", None)
        stride = _argument(node, 2, "stride", None)
        padding = _argument(node, 3, "padding", 0)
        if op == "maxpool2d":
            fixed = [("dilation", _pair(_argument(node, 4, "dilation", 1), "dilation", where), 1),
                     ("ceil_mode", _argument(node, 5, "ceil_mode", False), False),
                     ("return_indices", _argument(node, 6, "return_indices", False), False)]
        else:
            fixed = [("ceil_mode", _argument(node, 4, "ceil_mode", False), False),
                     ("divisor_override", _argument(node, 6, "divisor_override", None), None)]
            if _pair(padding, "padding", where) != 0:
                fixed.append(("count_include_pad", _argument(node, 5, "count_include_pad", True), True))
        return self.layer(node, op, _pool_args(where, kernel, stride, padding, fixed), x)

    def mean(self, node, x, where):
        # The mean over H and W of [N, C, H, W] is global average pooling, exactly; a mean over
        # one other dim (a sequence's tokens, a signal's time steps) is Joule's `mean`.
        dims = _argument(node, 1, "dim", None)
        keepdim = _argument(node, 2, "keepdim", False)
        rank = len(self.in_shape(node))
        dims_list = [dims] if isinstance(dims, int) else list(dims or ())
        normalized = sorted(d + rank if isinstance(d, int) and d < 0 else d for d in dims_list)
        plain = keepdim is False and _argument(node, 3, "dtype", None) is None
        if rank >= 3 and len(normalized) == 1 and normalized[0] != 0 and plain:
            return self.layer(node, "mean", {"dim": self.sample_dim(node, normalized[0], where)}, x)
        if rank != 4 or normalized != [2, 3] or not isinstance(keepdim, bool) or \
                _argument(node, 3, "dtype", None) is not None:
            raise SpecError(f"{where}: a mean over dims {dims} of a {rank}-dim batch (keepdim={keepdim}); Joule has "
                            "kinds for the mean over one dim of a sample (keepdim=False) and for the mean over H and W "
                            "of [N, C, H, W] (global average pooling)")
        name = self.emit(node, "adaptive_avgpool2d", {"output_size": 1}, [x])
        if keepdim:
            return _Value("tensor", name)
        return _Value("tensor", self.emit(node, "flatten", {}, [_Value("tensor", name)], name=f"{name}.flatten"))

    def finish(self, output):
        result = output.args[0] if output is not None and output.args else None
        if not hasattr(result, "op"):
            raise SpecError(f"{self.model_name()}.forward returns {type(result).__name__}; Joule needs one tensor "
                            "computed from the input")
        value = self.values.get(result)
        if value is None or value.kind != "tensor":
            raise SpecError(f"{self.model_name()}.forward returns {result.name}, which is not a tensor computed from "
                            "the input")
        if not self.layers or value.ref == "input":
            raise SpecError(f"{self.model_name()}.forward returns its input: there are no layers to describe")
        for layer in self.layers:
            name = layer["name"]
            if name != value.ref and name not in self.used:
                raise SpecError(f"{self.where(self.node_of_layer[name])}: its output ({name}) is never used; a Joule "
                                "spec ends in one output")
        if self.layers[-1]["name"] != value.ref:
            raise AssertionError("the network's output is not its last layer")
        return self.layers
