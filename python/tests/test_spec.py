"""joule.spec: real networks traced into specs, whose parameter count and output shape, as
Joule's own analyser computes them in a real jouled (POST /v1/estimate), equal PyTorch's; and
models Joule cannot describe, refused in one line naming the module and the op."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # the package, and support.py beside this file

import joule  # noqa: E402
from support import Jouled, require_torch  # noqa: E402

daemon = None


def setUpModule():
    global daemon
    try:
        import torch  # noqa: F401
    except ImportError:
        return  # the classes below skip, saying why
    daemon = Jouled()


def tearDownModule():
    if daemon is not None:
        daemon.stop()


@require_torch
class TracedNetworksTest(unittest.TestCase):
    """One test per network of tests/networks.py (generated below)."""

    def check_network(self, name):
        import torch

        import networks

        factory, batch = networks.NETWORKS[name]
        torch.manual_seed(0)
        model, example = factory(), batch()
        spec = joule.spec(model, example, name=name)
        with torch.no_grad():
            expected_shape = list(model.eval()(example).shape[1:])
        expected_parameters = sum(p.numel() for p in model.parameters())
        self.assertEqual(spec["input"]["shape"], list(example.shape[1:]))
        try:
            answer = joule.Client(daemon.url).estimate(spec, {"batch_size": 2, "samples_per_epoch": 2})
        except joule.ApiError as error:
            self.fail(f"jouled refused the spec of {name}: {error}")
        self.assertEqual(answer["model"]["parameters"], expected_parameters, name)
        self.assertEqual(answer["model"]["layers"][-1]["output_shape"], expected_shape, name)
        self.assertEqual(len(answer["model"]["layers"]), len(spec["layers"]))
        return spec


def _network_test(name):
    def test(self):
        self.check_network(name)
    test.__name__ = f"test_{name}"
    test.__doc__ = f"{name}: parameters and output shape as PyTorch counts them"
    return test


def _add_network_tests():
    try:
        import networks
    except ImportError:
        return
    for name in networks.NETWORKS:
        setattr(TracedNetworksTest, f"test_{name}", _network_test(name))


_add_network_tests()


@require_torch
class BundledSpecsTest(unittest.TestCase):
    def test_bundled_cifar_specs_are_the_traced_torchvision_models(self):
        import json

        import torch
        import torchvision

        from support import SOURCE_DIR

        for file, name, factory in (("resnet18_cifar.json", "resnet18-cifar", torchvision.models.resnet18),
                                    ("mobilenetv2_cifar.json", "mobilenetv2-cifar", torchvision.models.mobilenet_v2)):
            with open(os.path.join(SOURCE_DIR, "examples", "models", file), encoding="utf-8") as bundled:
                spec = json.load(bundled)
            model = factory(num_classes=10)
            self.assertEqual(spec, joule.spec(model, torch.zeros(2, 3, 32, 32), name=name), file)
            answer = joule.Client(daemon.url).estimate(spec, batch_size=64, samples_per_epoch=50000)
            self.assertEqual(answer["model"]["parameters"], sum(p.numel() for p in model.parameters()), file)


@require_torch
class SpecStructureTest(unittest.TestCase):
    """What the tracer writes, checked without jouled."""

    def spec_of(self, name):
        import networks

        factory, batch = networks.NETWORKS[name]
        return joule.spec(factory(), batch())

    def test_optimizer_names_are_what_a_jobs_training_says(self):
        import torch

        parameters = [torch.nn.Parameter(torch.zeros(2))]
        self.assertEqual(joule.optimizer_name(torch.optim.SGD(parameters, lr=0.1)), "sgd")
        self.assertEqual(joule.optimizer_name(torch.optim.SGD(parameters, lr=0.1, momentum=0.9)), "sgd_momentum")
        self.assertEqual(joule.optimizer_name(torch.optim.Adam(parameters)), "adam")
        self.assertEqual(joule.optimizer_name(torch.optim.AdamW(parameters)), "adamw")
        self.assertEqual(joule.optimizer_name(torch.optim.RMSprop(parameters)), "rmsprop")
        with self.assertRaises(joule.SpecError) as raised:
            joule.optimizer_name(torch.optim.Adagrad(parameters))
        self.assertIn("Adagrad", str(raised.exception))

    def test_resnet_blocks_join_with_add_naming_their_branches(self):
        spec = self.spec_of("resnet18")
        adds = [layer for layer in spec["layers"] if layer["type"] == "add"]
        self.assertEqual(len(adds), 8)
        self.assertEqual(adds[0], {"type": "add", "name": "layer1.0.add", "inputs": ["layer1.0.bn2", "maxpool"]})
        downsample = next(layer for layer in spec["layers"] if layer["name"] == "layer2.0.downsample.0")
        self.assertEqual(downsample["inputs"], ["layer1.1.relu:1"])  # the block's second relu, shared module
        names = [layer["name"] for layer in spec["layers"]]
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(spec["layers"][0], {"type": "conv2d", "name": "conv1", "out_channels": 64,
                                             "kernel_size": 7, "stride": 2, "padding": 3, "bias": False})
        self.assertEqual(spec["loss"], "cross_entropy")
        self.assertEqual(spec["input"], {"shape": [3, 32, 32]})

    def test_mobilenet_has_depthwise_convolutions_and_relu6(self):
        spec = self.spec_of("mobilenet_v2")
        depthwise = [layer for layer in spec["layers"] if layer.get("groups", 1) > 1]
        self.assertEqual(len(depthwise), 17)
        self.assertTrue(all(layer["groups"] == layer["out_channels"] for layer in depthwise))
        self.assertIn("relu6", {layer["type"] for layer in spec["layers"]})

    def test_recurrent_outputs_follow_what_the_network_uses(self):
        self.assertEqual(self.spec_of("lstm_classifier")["layers"][1],
                         {"type": "lstm", "name": "lstm", "hidden_size": 64, "num_layers": 2, "output": "last"})
        self.assertEqual(self.spec_of("gru_tagger")["layers"][0]["output"], "sequence")
        self.assertEqual(self.spec_of("gru_final_state")["layers"][0]["output"], "last")

    def test_transformer_encoder_is_expanded_into_its_layers(self):
        spec = self.spec_of("transformer_classifier")
        self.assertEqual(spec["input"], {"shape": [16], "dtype": "token"})
        self.assertEqual([layer["name"] for layer in spec["layers"]],
                         ["embedding", "first", "encoder.layers.0", "encoder.layers.1", "encoder.norm", "head.0",
                          "head.1"])
        self.assertEqual(spec["layers"][2], {"type": "transformer_encoder_layer", "name": "encoder.layers.0",
                                             "nhead": 4, "dim_feedforward": 96})

    def test_functional_ops_and_idioms_map_to_layers(self):
        spec = self.spec_of("lenet5")
        self.assertEqual([layer["type"] for layer in spec["layers"]],
                         ["conv2d", "relu", "maxpool2d", "conv2d", "relu", "maxpool2d", "flatten", "linear", "relu",
                          "linear", "relu", "linear"])
        small = self.spec_of("small_cnn")
        self.assertEqual(small["layers"][4]["padding"], 1)  # padding="same"
        self.assertEqual(small["layers"][-1], {"type": "softmax", "name": "softmax", "dim": 0})
        self.assertEqual([layer["p"] for layer in small["layers"] if layer["type"] == "dropout"], [0.25, 0.1])
        se = self.spec_of("se_net")
        mean = next(layer for layer in se["layers"] if layer["name"] == "se.mean")
        self.assertEqual(mean, {"type": "adaptive_avgpool2d", "name": "se.mean", "output_size": 1})
        self.assertEqual(next(layer for layer in se["layers"] if layer["type"] == "mul")["inputs"],
                         ["conv", "se.sigmoid"])
        # Activations with their arguments, from modules and from functions.
        self.assertEqual([{key: value for key, value in layer.items() if key != "name"}
                          for layer in self.spec_of("activations")["layers"] if not layer["type"] == "linear"],
                         [{"type": "leaky_relu", "negative_slope": 0.2}, {"type": "elu", "alpha": 0.5},
                          {"type": "softplus", "beta": 2.0, "threshold": 10.0}, {"type": "mish"},
                          {"type": "leaky_relu", "negative_slope": 0.05}, {"type": "elu", "alpha": 2.0},
                          {"type": "softplus", "beta": 3.0, "threshold": 20.0}, {"type": "mish"}])
        # Bidirectional recurrences: the whole sequence, or both directions' outputs at its last step.
        recurrent = [layer for layer in self.spec_of("bidirectional_tagger")["layers"] if layer["type"] in ("lstm", "gru")]
        self.assertEqual(recurrent, [
            {"type": "lstm", "name": "tagger", "hidden_size": 24, "num_layers": 2, "output": "sequence",
             "bidirectional": True},
            {"type": "gru", "name": "summary", "hidden_size": 12, "output": "last", "bidirectional": True}])
        # Pre-norm GELU encoder layers, as nn.TransformerEncoder's layers.
        encoders = [layer for layer in self.spec_of("prenorm_encoder")["layers"]
                    if layer["type"] == "transformer_encoder_layer"]
        self.assertEqual(encoders, [{"type": "transformer_encoder_layer", "name": f"encoder.layers.{index}", "nhead": 4,
                                     "dim_feedforward": 64, "norm_first": True, "activation": "gelu"}
                                    for index in (0, 1)])
        # A mean over one dim of a sample (time steps, tokens) is Joule's mean, per-sample dim.
        self.assertEqual(self.spec_of("mean_over_time")["layers"][2], {"type": "mean", "name": "mean", "dim": 1})
        self.assertEqual(self.spec_of("mean_over_tokens")["layers"][2], {"type": "mean", "name": "mean", "dim": 0})
        concat = next(layer for layer in self.spec_of("inception_net")["layers"] if layer["type"] == "concat")
        self.assertEqual(concat["dim"], 0)
        self.assertEqual(concat["inputs"], ["mixed.branch1", "mixed.branch3.2", "mixed.branch5.2", "mixed.pool.1"])

    def test_tracing_leaves_the_model_as_it_was(self):
        import torch

        import networks

        model = networks.small_cnn().eval()
        before = {key: value.clone() for key, value in model.state_dict().items()}
        joule.spec(model, torch.randn(2, 3, 32, 32))
        self.assertFalse(any(module.training for module in model.modules()))
        for key, value in model.state_dict().items():
            self.assertTrue(torch.equal(value, before[key]), key)


@require_torch
class BadModelsTest(unittest.TestCase):
    """Each refusal is one line that names the module path and the op."""

    def refusal(self, model, example=None):
        import torch

        example = torch.randn(2, 8) if example is None else example
        with self.assertRaises(joule.SpecError) as raised:
            joule.spec(model, example)
        message = str(raised.exception)
        self.assertNotIn("\n", message)
        return message

    def test_data_dependent_control_flow(self):
        import torch.nn as nn

        class Gate(nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    return x
                return -x

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
                self.gate = Gate()

            def forward(self, x):
                return self.gate(self.fc(x))

        message = self.refusal(Net())
        self.assertIn("cannot trace Net in module gate (Gate)", message)
        self.assertIn("data-dependent control flow", message)
        self.assertIn("test_spec.py:", message)
        self.assertIn("if x.sum() > 0:", message)

    def test_an_unsupported_module(self):
        import torch
        import torch.nn as nn

        class Up(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(4, 16, 3, padding=1)
                self.shuffle = nn.PixelShuffle(2)

            def forward(self, x):
                return self.shuffle(self.conv(x))

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.up = Up()

            def forward(self, x):
                return self.up(x)

        message = self.refusal(Net(), torch.randn(2, 4, 8, 8))
        self.assertEqual(message, "module up.shuffle (PixelShuffle): no Joule layer kind for nn.PixelShuffle")

    def test_an_unsupported_function(self):
        import torch
        import torch.nn as nn

        class Spectral(nn.Module):
            def forward(self, x):
                return torch.fft.fft2(x).real

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.spectral = Spectral()
                self.fc = nn.Linear(8, 2)

            def forward(self, x):
                return self.fc(self.spectral(x))

        message = self.refusal(Net())
        self.assertTrue(message.startswith("torch.fft.fft2 in module spectral at test_spec.py:"), message)
        self.assertIn("no Joule layer kind", message)

    def test_scalar_arithmetic_is_not_dropped(self):
        import torch.nn as nn

        class Scaled(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)

            def forward(self, x):
                return self.fc(x) * 0.5

        message = self.refusal(Scaled())
        self.assertIn("operator.mul in Scaled.forward", message)
        self.assertIn("multiplies by a constant (0.5)", message)

    def test_options_joule_cannot_express(self):
        import torch
        import torch.nn as nn

        class Stacked(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM(8, 16, num_layers=2, dropout=0.2, batch_first=True)

            def forward(self, x):
                out, _ = self.rnn(x)
                return out

        message = self.refusal(Stacked(), torch.randn(2, 5, 8))
        self.assertEqual(message, "module rnn (LSTM): dropout=0.2 has no Joule equivalent (Joule's lstm has "
                                  "dropout=0.0)")

        approximate = nn.TransformerEncoderLayer(16, 2, 32, activation=nn.GELU(approximate="tanh"), batch_first=True)
        message = self.refusal(nn.Sequential(approximate), torch.randn(2, 5, 16))
        self.assertEqual(message, "module 0 (TransformerEncoderLayer): activation GELU(approximate='tanh') (only "
                                  "relu and the exact gelu); Joule's transformer_encoder_layer is torch's "
                                  "(batch_first=True, dropout 0.1, relu or gelu, post-norm or norm_first)")

        class BidirectionalState(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.GRU(8, 16, batch_first=True, bidirectional=True)

            def forward(self, x):
                _, h_n = self.rnn(x)
                return h_n[-1]

        message = self.refusal(BidirectionalState(), torch.randn(2, 5, 8))
        self.assertEqual(message, "module rnn (GRU): uses the final hidden state h_n of a bidirectional gru, which "
                                  "Joule does not model; take the output's last step (out[:, -1]: both directions) "
                                  "or the whole output sequence")
        message = self.refusal(nn.Sequential(nn.Conv2d(3, 4, (3, 5))), torch.randn(2, 3, 8, 8))
        self.assertEqual(message, "module 0 (Conv2d): kernel_size (3, 5) is not square; Joule's layers take one int "
                                  "for every spatial dim")

    def test_indexing_and_reshaping_other_than_flattening(self):
        import torch
        import torch.nn as nn

        class Permuted(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 6)

            def forward(self, x):
                return self.fc(x).view(-1, 2, 3)

        message = self.refusal(Permuted())
        self.assertIn("Tensor.view in Permuted.forward", message)
        self.assertIn("reshapes [2, 6] to [2, 2, 3]", message)

        class Sliced(nn.Module):
            def forward(self, x):
                return torch.relu(x[:, :4])

        self.assertIn("indexing [:, :4] in Sliced.forward", self.refusal(Sliced()))

        class KeptMean(nn.Module):
            def forward(self, x):
                return torch.relu(x.mean(1, keepdim=True))

        self.assertIn("a mean over dims 1 of a 3-dim batch (keepdim=True); Joule has kinds for the mean over one dim "
                      "of a sample (keepdim=False)", self.refusal(KeptMean(), torch.randn(2, 5, 8)))

    def test_a_shape_mismatch_names_the_module(self):
        import torch.nn as nn

        message = self.refusal(nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(5, 2)))
        self.assertTrue(message.startswith("Sequential fails on the example input [2, 8] in module 2 (Linear):"),
                        message)

    def test_bad_arguments(self):
        import torch
        import torch.nn as nn

        self.assertIn("give a batch", self.refusal(nn.Linear(8, 2), torch.randn(8)))
        with self.assertRaises(joule.SpecError):
            joule.spec(nn.Linear(8, 2), torch.randn(2, 8), loss="hinge")
        with self.assertRaises(joule.SpecError):
            joule.spec(lambda x: x, torch.randn(2, 8))


if __name__ == "__main__":
    unittest.main()
