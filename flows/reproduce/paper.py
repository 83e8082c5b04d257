"""The paper's published numbers that the reproduction is compared with.

Tables 7 and 8 (Appendix D) for the five CIFAR classifiers whose logits are in the shared
data folder (the paper also has WRN-26-10 and DenseNet-121, which we do not have),
transcribed without the significance markers. Per (dataset, classifier): an ``uncal`` row
(accuracy %, ECE %, NLL, Brier) and one row per calibrator: dAcc (pp from Uncal.),
Base TPCR (%), Base ECE (%), dR ECE (pp), Base NLL, dR NLL, Base Brier, dR Brier, where
dR M = M(Base) - M(Base+CORD).
"""

from __future__ import annotations

_TABLES_7_8 = """
cifar10 vgg16_bn uncal 94.09 4.79 0.3353 0.1056
cifar10 vgg16_bn vs -0.04 0.35 1.46 0.04 0.2243 0.0002 0.0941 0.0001
cifar10 vgg16_bn svs 0.00 0.23 1.56 -0.05 0.2253 0.0000 0.0944 0.0000
cifar10 vgg16_bn ms -0.12 0.86 1.52 0.11 0.2275 0.0019 0.0956 0.0010
cifar10 vgg16_bn sms -0.02 0.29 1.54 -0.01 0.2191 0.0000 0.0939 0.0000
cifar10 vgg16_bn dir-odir -0.08 0.59 1.80 0.10 0.2231 0.0005 0.0947 0.0004
cifar10 vgg16_bn irova -0.08 0.42 1.70 0.02 0.2759 0.0036 0.0929 0.0002
cifar10 vgg16_bn irova-ts -0.10 0.54 1.59 0.00 0.2688 0.0028 0.0924 0.0002
cifar10 resnet56 uncal 94.38 3.75 0.2525 0.0939
cifar10 resnet56 vs -0.10 0.48 1.00 0.05 0.1884 0.0003 0.0866 0.0002
cifar10 resnet56 svs -0.04 0.24 0.94 0.02 0.1889 0.0001 0.0863 0.0000
cifar10 resnet56 ms -0.26 1.25 1.12 0.27 0.1884 0.0017 0.0886 0.0012
cifar10 resnet56 sms -0.11 0.58 1.00 0.01 0.1841 0.0003 0.0861 0.0002
cifar10 resnet56 dir-odir -0.09 1.01 1.01 0.07 0.1862 0.0007 0.0872 0.0005
cifar10 resnet56 irova -0.04 0.62 1.33 -0.01 0.2302 0.0033 0.0861 0.0000
cifar10 resnet56 irova-ts -0.06 0.76 1.11 0.01 0.2250 0.0032 0.0858 0.0001
cifar10 mobilenetv2_x1_4 uncal 94.14 3.73 0.2509 0.0977
cifar10 mobilenetv2_x1_4 vs -0.13 0.80 1.22 0.02 0.1972 0.0006 0.0909 0.0005
cifar10 mobilenetv2_x1_4 svs -0.06 0.48 1.31 0.05 0.1984 0.0001 0.0906 0.0001
cifar10 mobilenetv2_x1_4 ms -0.34 1.52 1.50 0.34 0.1987 0.0028 0.0933 0.0019
cifar10 mobilenetv2_x1_4 sms -0.07 0.67 1.20 -0.02 0.1939 0.0004 0.0907 0.0004
cifar10 mobilenetv2_x1_4 dir-odir -0.21 1.08 1.42 0.09 0.1969 0.0012 0.0920 0.0010
cifar10 mobilenetv2_x1_4 irova -0.13 0.93 1.45 -0.03 0.2320 0.0024 0.0914 0.0002
cifar10 mobilenetv2_x1_4 irova-ts -0.11 0.97 1.34 0.04 0.2284 0.0020 0.0910 0.0002
cifar10 shufflenetv2_x1_0 uncal 93.35 4.03 0.2839 0.1091
cifar10 shufflenetv2_x1_0 vs -0.03 0.65 1.06 0.02 0.2222 0.0002 0.1024 0.0001
cifar10 shufflenetv2_x1_0 svs +0.02 0.37 1.10 0.02 0.2226 0.0000 0.1023 0.0000
cifar10 shufflenetv2_x1_0 ms -0.25 1.56 1.22 0.10 0.2245 0.0015 0.1048 0.0011
cifar10 shufflenetv2_x1_0 sms -0.03 0.78 1.10 0.02 0.2194 0.0001 0.1023 0.0001
cifar10 shufflenetv2_x1_0 dir-odir -0.20 1.38 1.11 -0.05 0.2248 0.0011 0.1044 0.0008
cifar10 shufflenetv2_x1_0 irova -0.08 1.01 1.52 0.11 0.2766 0.0022 0.1033 0.0003
cifar10 shufflenetv2_x1_0 irova-ts -0.08 0.92 1.20 0.03 0.2738 0.0018 0.1028 0.0002
cifar10 repvgg_a1 uncal 94.78 3.49 0.2319 0.0871
cifar10 repvgg_a1 vs -0.08 0.39 1.18 0.04 0.1807 0.0004 0.0806 0.0002
cifar10 repvgg_a1 svs -0.04 0.20 1.15 0.02 0.1812 0.0001 0.0806 0.0001
cifar10 repvgg_a1 ms -0.15 1.20 1.32 0.19 0.1804 0.0020 0.0819 0.0011
cifar10 repvgg_a1 sms -0.08 0.46 1.13 0.04 0.1768 0.0003 0.0802 0.0002
cifar10 repvgg_a1 dir-odir -0.18 1.00 1.25 0.25 0.1800 0.0012 0.0813 0.0008
cifar10 repvgg_a1 irova -0.05 0.62 1.49 0.05 0.2328 0.0044 0.0806 0.0002
cifar10 repvgg_a1 irova-ts -0.04 0.71 1.28 0.04 0.2269 0.0038 0.0805 0.0001
cifar100 vgg16_bn uncal 71.27 20.66 1.8368 0.4788
cifar100 vgg16_bn vs +0.26 5.08 4.43 0.38 1.2272 0.0006 0.4003 0.0001
cifar100 vgg16_bn svs +0.04 1.01 4.09 0.06 1.2261 -0.0002 0.4034 0.0000
cifar100 vgg16_bn ms -2.14 16.55 9.77 6.91 1.7526 0.0659 0.4487 0.0229
cifar100 vgg16_bn sms +0.14 3.24 3.91 -0.02 1.2167 -0.0007 0.3997 -0.0002
cifar100 vgg16_bn dir-odir +0.20 6.27 3.45 0.20 1.2100 0.0016 0.4000 0.0005
cifar100 vgg16_bn irova -0.09 6.24 7.22 0.82 1.7156 0.0103 0.4099 0.0023
cifar100 vgg16_bn irova-ts -0.53 7.41 4.23 1.08 1.6109 0.0083 0.4017 0.0020
cifar100 resnet56 uncal 67.64 15.97 1.5343 0.4801
cifar100 resnet56 vs +0.27 9.34 3.30 0.77 1.2323 0.0006 0.4342 0.0005
cifar100 resnet56 svs +0.15 2.04 2.60 0.14 1.2381 -0.0003 0.4367 -0.0001
cifar100 resnet56 ms -13.06 39.96 39.18 37.26 6.9181 2.4006 0.8248 0.2684
cifar100 resnet56 sms +0.32 6.51 2.62 0.55 1.2254 -0.0011 0.4323 -0.0005
cifar100 resnet56 dir-odir +0.15 11.58 2.30 0.61 1.2214 0.0020 0.4338 0.0010
cifar100 resnet56 irova -0.19 8.30 6.46 1.08 1.7049 0.0118 0.4448 0.0026
cifar100 resnet56 irova-ts -0.27 9.78 3.46 0.90 1.6676 0.0070 0.4399 0.0015
cifar100 mobilenetv2_x1_4 uncal 71.26 11.42 1.2337 0.4177
cifar100 mobilenetv2_x1_4 vs -0.02 7.88 3.60 0.53 1.1040 0.0021 0.3921 0.0012
cifar100 mobilenetv2_x1_4 svs +0.10 1.65 3.14 0.02 1.1068 0.0000 0.3944 0.0000
cifar100 mobilenetv2_x1_4 ms -12.73 35.95 40.81 36.77 10.6075 5.7217 0.8195 0.3119
cifar100 mobilenetv2_x1_4 sms +0.17 5.06 2.66 0.04 1.0964 -0.0001 0.3902 -0.0002
cifar100 mobilenetv2_x1_4 dir-odir +0.04 9.47 2.81 0.51 1.0901 0.0039 0.3906 0.0018
cifar100 mobilenetv2_x1_4 irova -0.37 7.49 5.48 0.49 1.5513 0.0110 0.3982 0.0018
cifar100 mobilenetv2_x1_4 irova-ts -0.36 8.61 3.45 0.34 1.5129 0.0091 0.3944 0.0010
cifar100 shufflenetv2_x1_0 uncal 66.82 11.83 1.4419 0.4716
cifar100 shufflenetv2_x1_0 vs +0.34 9.55 4.37 0.62 1.3073 0.0010 0.4474 0.0003
cifar100 shufflenetv2_x1_0 svs +0.12 2.25 3.95 0.08 1.3148 -0.0001 0.4502 0.0000
cifar100 shufflenetv2_x1_0 ms -13.16 40.51 45.54 38.92 11.8949 6.0656 0.9153 0.3384
cifar100 shufflenetv2_x1_0 sms +0.46 6.34 3.53 0.21 1.3015 -0.0006 0.4453 -0.0005
cifar100 shufflenetv2_x1_0 dir-odir +0.51 11.39 3.39 0.79 1.2856 0.0038 0.4447 0.0012
cifar100 shufflenetv2_x1_0 irova -0.17 9.59 6.11 0.74 1.7878 0.0123 0.4549 0.0021
cifar100 shufflenetv2_x1_0 irova-ts -0.20 10.03 3.89 0.31 1.7594 0.0089 0.4522 0.0013
cifar100 repvgg_a1 uncal 70.59 8.11 1.2381 0.4106
cifar100 repvgg_a1 vs +0.46 8.17 5.16 0.71 1.1934 0.0027 0.3997 0.0012
cifar100 repvgg_a1 svs +0.14 1.89 4.50 0.12 1.1999 -0.0001 0.4026 -0.0001
cifar100 repvgg_a1 ms -11.08 34.50 39.62 33.97 10.2162 5.1115 0.7976 0.2846
cifar100 repvgg_a1 sms +0.34 5.02 4.35 0.38 1.1873 0.0002 0.3986 0.0000
cifar100 repvgg_a1 dir-odir +0.36 10.06 4.24 0.93 1.1496 0.0025 0.3972 0.0014
cifar100 repvgg_a1 irova +0.08 8.78 5.67 0.65 1.5807 0.0161 0.4032 0.0015
cifar100 repvgg_a1 irova-ts -0.16 9.36 4.46 0.47 1.5541 0.0147 0.4005 0.0011
"""

#: Tables 1, 2, 3/10 and 6 of the paper, for the side-by-side views of the report.
TABLE1 = {  # dataset: (dR ECE pp, dR NLL, dR Brier x 1e-3)
    "cifar10": (0.061, 0.0014, 0.361),
    "cifar100": (4.642, 0.5114, 33.691),
}
TABLE2 = {  # dataset: {repair: (ECE %, NLL, Brier)}
    "cifar10": {"minimal": (1.285, 0.208, 0.0858), "cord": (1.240, 0.207, 0.0857)},
    "cifar100": {"minimal": (5.144, 1.875, 0.4055), "cord": (3.912, 1.705, 0.4041)},
}
TABLE3 = {  # dataset: {variant: (ECE %, NLL, Brier, |mean s - mean b| pp)}; C-10 is Table 10
    "cifar10": {"mean_none": (1.271, 0.2073, 0.0858, 0.104),
                "mean_local": (1.270, 0.2073, 0.0858, 0.098),
                "mean_pointwise": (1.257, 0.2072, 0.0857, 0.058),
                "cord": (1.240, 0.2071, 0.0857, 0.019)},
    "cifar100": {"mean_none": (5.265, 1.844, 0.4056, 2.808),
                 "mean_local": (4.786, 1.736, 0.4050, 2.277),
                 "mean_pointwise": (5.000, 1.841, 0.4052, 2.388),
                 "cord": (3.912, 1.705, 0.4041, 0.579)},
}
TABLE6 = {  # lambda: (dR ECE pp, dR NLL, dR Brier x 1e-3), over all 114 paper conditions
    0.0: (1.888, 0.2212, 14.731), 0.1: (1.936, 0.2220, 14.761),
    0.3: (2.147, 0.2224, 14.748), 0.5: (2.140, 0.2225, 14.939),
    0.7: (2.108, 0.2225, 14.959), 0.9: (2.061, 0.2222, 14.892),
    1.0: (2.054, 0.2222, 14.878),
}
#: Table 5: CORD construction (s) and repair (us per example), post-warm-up medians,
#: single-threaded, q from IROvA-TS, 5000 calibration rows.
TABLE5 = {"cifar10": (0.268, 0.978), "cifar100": (0.280, 1.996)}

_CELL_KEYS = ("d_acc", "tpcr", "ece", "d_ece", "nll", "d_nll", "brier", "d_brier")
_UNCAL_KEYS = ("uncal_acc", "uncal_ece", "uncal_nll", "uncal_brier")


def table7_cells() -> dict[tuple[str, str, str], dict[str, float]]:
    """{(dataset, classifier, calibrator): values} with the keys uncal_acc, uncal_ece,
    uncal_nll, uncal_brier (of the classifier) and d_acc, tpcr, ece, d_ece, nll, d_nll,
    brier, d_brier (of the calibrator), in the paper's units (%, pp)."""
    uncal: dict[tuple[str, str], dict[str, float]] = {}
    cells: dict[tuple[str, str, str], dict[str, float]] = {}
    for line in _TABLES_7_8.strip().splitlines():
        dataset, classifier, column, *values = line.split()
        numbers = [float(v) for v in values]
        if column == "uncal":
            uncal[(dataset, classifier)] = dict(zip(_UNCAL_KEYS, numbers, strict=True))
        else:
            cells[(dataset, classifier, column)] = dict(zip(_CELL_KEYS, numbers, strict=True))
    return {key: {**uncal[key[:2]], **values} for key, values in cells.items()}
