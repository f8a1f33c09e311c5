"""A synthetic DrivaerML: car-like bluff bodies with the real file layout, names and dtypes.

The real DrivaerML (Ashton et al. 2024, CC-BY-SA 4.0) cannot be downloaded on every machine,
so tests, the demo and the benchmarks run on this generator. Every run ``i`` gets a folder
``run_i/`` holding exactly the files of the real data set:

==========================  ====================================================================
``boundary_i.vtp``          closed triangulated body; **cell data** (float32) ``pMeanTrim`` [Pa],
                            ``CpMeanTrim`` [-], ``wallShearStressMeanTrim`` (3 components) [Pa]
``volume_i.vtu``            tetrahedra around the body, above a ground plane ``z = 0``; cell data
                            ``UMeanTrim`` (3) [m/s], ``pMeanTrim`` [Pa], ``nutMeanTrim`` [m^2/s];
                            with ``split_volume=True`` its bytes are split into
                            ``volume_i.vtu.00.part`` and ``volume_i.vtu.01.part`` like the download
``drivaer_i.stl``           the body surface as a binary STL (watertight, outward normals)
``force_mom_i.csv``         ``Cd, Cl, Cs``, forces ``Fx, Fy, Fz`` [N], moments ``Mx, My, Mz`` [N m]
                            about ``(xref, yref, zref)``, reference area ``Aref`` [m^2]
``geo_parameters_i.csv``    the body's geometric parameters (one header row, one value row)
==========================  ====================================================================

Free stream: ``U_inf = 30 m/s`` along ``+x``, ``rho = 1.225 kg/m^3``, gauge pressure 0.

Body. The body spans ``0 <= x <= L`` and is a tube of superellipse cross-sections
``(|y| / a(x))^m + (|z - z_c(x)| / b(x))^m <= 1``. With ``x = L (1 - cos t) / 2`` the envelope
``f = sin(t)^e`` closes it at the nose and the tail (``e`` sets the bluntness); a top profile
``tau(x)`` rises from the bonnet over a windscreen to the roof and drops over a rear slant (the
rear height distinguishes fastbacks from squarebacks). The bottom is flat at the ride height.
Ten parameters, drawn per run, are written to ``geo_parameters_i.csv``.

Surface fields. With outward unit normal ``n``, the attached-flow surface speed is
``k |e_x - (e_x . n) n|`` (a potential-flow-like model; ``k`` grows on upward-facing cells:
suction over the roof), so ``Cp_att = 1 - k^2 (1 - n_x^2)`` has its stagnation point ``Cp = 1``
at the nose. Downstream-facing cells behind the separation line blend smoothly to a base
pressure ``Cp_base`` that drops with the rear height (a wake, hence drag). The wall shear stress
``tau_w = q_inf c_f k^1.8 |t|^0.8 (1 - 1.5 s) t`` with ``t = e_x - (e_x . n) n`` is tangential
by construction and reverses in the separated region ``s``. ``force_mom_i.csv`` integrates
``-p n + tau_w`` over the cells, using the geometry of the float32 file coordinates, so a
reader recomputes the same forces to float rounding.

Volume fields. Potential flow past an ellipsoid-scaled sphere plus a Gaussian wake that widens
and decays downstream; ``p`` follows Bernoulli outside the wake and the base pressure inside;
``nut`` is raised in the wake and near the body.

Speed: vectorised numpy; a 10k-cell run takes well under a second plus file writing; the
volume grid is a graded, jittered lattice cut into conforming tetrahedra (6 per hexahedron),
so 10M cells take seconds, not a Delaunay triangulation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .._checks import check_positive_int
from ..partition import cell_centres
from ._geometry import polygon_normals_areas

__all__ = [
    "U_INF",
    "RHO",
    "CarParameters",
    "make_synthetic_drivaerml",
    "car_surface",
    "surface_fields",
    "dynamic_pressure",
    "integrate_forces",
]

#: Free-stream speed [m/s] of DrivaerML.
U_INF = 30.0
#: Air density [kg/m^3] used to convert pressure coefficients to Pa.
RHO = 1.225


def dynamic_pressure(rho: float = RHO, u_inf: float = U_INF) -> float:
    """``q = rho U_inf^2 / 2`` [Pa], the scale of the force coefficients."""
    return 0.5 * rho * u_inf**2


_Q_INF = dynamic_pressure()


def _smoothstep(x: np.ndarray, centre: float, width: float) -> np.ndarray:
    u = np.clip((x - centre) / width + 0.5, 0.0, 1.0)
    return u * u * (3.0 - 2.0 * u)


@dataclass(frozen=True)
class CarParameters:
    """Geometric parameters of one synthetic car (lengths in m, positions as fractions of length)."""

    length: float
    width: float
    height: float
    ride_height: float
    hood_height: float
    windscreen_x: float
    roof_end_x: float
    rear_height: float
    nose_bluntness: float
    squareness: float

    @classmethod
    def sample(cls, rng: np.random.Generator) -> CarParameters:
        """Draw a car from ranges around a mid-size saloon."""
        u = rng.uniform(size=10)
        lo = np.array([4.2, 1.70, 1.30, 0.10, 0.50, 0.28, 0.60, 0.55, 0.35, 3.0])
        hi = np.array([4.9, 1.95, 1.55, 0.18, 0.65, 0.38, 0.75, 0.85, 0.60, 5.0])
        return cls(*(float(v) for v in lo + u * (hi - lo)))

    # -- the analytic body ------------------------------------------------------------------
    def _envelope(self, x: np.ndarray) -> np.ndarray:
        t = np.arccos(np.clip(1.0 - 2.0 * x / self.length, -1.0, 1.0))
        return np.sin(t) ** self.nose_bluntness

    def _profile(self, x: np.ndarray) -> np.ndarray:
        length = self.length
        rise = _smoothstep(x, self.windscreen_x * length, 0.12 * length)
        drop = _smoothstep(x, 0.5 * (self.roof_end_x + 1.0) * length, (1.0 - self.roof_end_x) * length)
        return self.hood_height + (1.0 - self.hood_height) * rise - (1.0 - self.rear_height) * drop

    def section(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Half-width ``a``, centre height ``z_c`` and half-height ``b`` of the cross-section at ``x``."""
        f = self._envelope(x)
        half = 0.5 * (self.height - self.ride_height) * self._profile(x)
        return 0.5 * self.width * f, self.ride_height + half, half * f

    def inside(self, points: np.ndarray) -> np.ndarray:
        """Whether each point (M, 3) lies strictly inside the analytic body."""
        x, y, z = points[:, 0], points[:, 1], points[:, 2]
        a, zc, b = self.section(x)
        ok = (x > 0.0) & (x < self.length) & (a > 0) & (b > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = (np.abs(y) / a) ** self.squareness + (np.abs(z - zc) / b) ** self.squareness
        return ok & (r < 1.0)


def car_surface(params: CarParameters, num_faces: int) -> tuple[np.ndarray, np.ndarray]:
    """Triangulate the body with about ``num_faces`` triangles (closed, outward oriented).

    **Shapes**: returns vertices (V, 3) float64 and faces (F, 3) int64 with
    ``F = 2 * n_around * n_rings`` close to ``num_faces``.
    """
    n_around = max(8, round(np.sqrt(0.6 * num_faces)))
    n_rings = max(2, round(num_faces / (2 * n_around)))  # rings of vertices between the two poles
    t = np.pi * np.arange(1, n_rings + 1) / (n_rings + 1)
    x = 0.5 * params.length * (1.0 - np.cos(t))
    a, zc, b = params.section(x)
    phi = 2.0 * np.pi * np.arange(n_around) / n_around
    e = 2.0 / params.squareness
    cy = np.sign(np.cos(phi)) * np.abs(np.cos(phi)) ** e
    sz = np.sign(np.sin(phi)) * np.abs(np.sin(phi)) ** e
    ring = np.stack(
        [np.repeat(x, n_around), (a[:, None] * cy).ravel(), (zc[:, None] + b[:, None] * sz).ravel()], axis=1
    )
    ends = np.array([0.0, params.length])
    _, zc_end, _ = params.section(ends)
    vertices = np.concatenate([[[0.0, 0.0, zc_end[0]]], ring, [[params.length, 0.0, zc_end[1]]]])
    last = len(vertices) - 1

    j = np.arange(n_around)
    jn = (j + 1) % n_around
    k = np.arange(n_rings - 1)[:, None]
    v00, v01 = 1 + k * n_around + j, 1 + k * n_around + jn
    v10, v11 = v00 + n_around, v01 + n_around
    band = np.concatenate([np.stack([v00, v01, v11], -1).reshape(-1, 3), np.stack([v00, v11, v10], -1).reshape(-1, 3)])
    front = np.stack([np.zeros_like(j), 1 + jn, 1 + j], axis=1)
    rear_ring = 1 + (n_rings - 1) * n_around
    rear = np.stack([np.full_like(j, last), rear_ring + j, rear_ring + jn], axis=1)
    faces = np.concatenate([front, band, rear]).astype(np.int64)
    # Orientation: the divergence theorem gives a positive volume for outward normals.
    tri = vertices[faces]
    volume = np.einsum("ij,ij->i", tri[:, 0], np.cross(tri[:, 1], tri[:, 2])).sum() / 6.0
    if volume < 0:
        faces = faces[:, ::-1].copy()
    return vertices, faces


def surface_fields(params: CarParameters, centres: np.ndarray, normals: np.ndarray) -> dict[str, np.ndarray]:
    """Mean pressure [Pa], pressure coefficient and wall shear stress [Pa] on the body cells.

    **Shapes**: ``centres``, ``normals`` (N, 3) -> ``pMeanTrim`` (N,), ``CpMeanTrim`` (N,),
    ``wallShearStressMeanTrim`` (N, 3), float32.
    """
    x = centres[:, 0]
    nx, nz = normals[:, 0], normals[:, 2]
    slender = (params.height - params.ride_height) / params.length
    k = 1.18 + 0.05 * nz * 3.5 * slender
    cp_attached = 1.0 - k**2 * (1.0 - nx**2)
    x_sep = params.length * (params.roof_end_x + 0.5 * (1.0 - params.roof_end_x) * params.rear_height)
    s = _smoothstep(nx, 0.35, 0.5) * _smoothstep(x, x_sep, 0.15 * params.length)
    cp_base = -0.12 - 0.22 * params.rear_height
    cp = (1.0 - s) * cp_attached + s * cp_base
    t = np.array([1.0, 0.0, 0.0]) - nx[:, None] * normals
    t_norm = np.linalg.norm(t, axis=1)
    scale = _Q_INF * 0.0035 * k**1.8 * t_norm**0.8 * (1.0 - 1.5 * s)
    return {
        "pMeanTrim": (cp * _Q_INF).astype(np.float32),
        "CpMeanTrim": cp.astype(np.float32),
        "wallShearStressMeanTrim": (scale[:, None] * t).astype(np.float32),
    }


def integrate_forces(
    centres: np.ndarray | torch.Tensor,
    normals: np.ndarray | torch.Tensor,
    areas: np.ndarray | torch.Tensor,
    pressure: np.ndarray | torch.Tensor,
    wall_shear: np.ndarray | torch.Tensor,
    reference_point: Sequence[float] = (0.0, 0.0, 0.0),
    reference_area: float | None = None,
    *,
    rho: float = RHO,
    u_inf: float = U_INF,
) -> dict[str, float]:
    """Integrate ``-p n + tau_w`` over surface cells: forces, moments and coefficients.

    The one force integration of meshshard: the synthetic data's ``force_mom_i.csv`` and the drag
    and lift of :func:`meshshard.training.evaluate` both come from here. The arrays may be numpy
    arrays or torch tensors, a :class:`~meshshard.tensor.ShardTensor` sharded over the cells
    included: every sum is then global, so every rank gets the whole surface's figures. Sums run in
    float64.

    ``reference_area`` defaults to the frontal area ``sum(A max(0, -n_x))`` (the projection of
    the upstream-facing cells on the ``yz`` plane). Coefficients use ``q = rho U_inf^2 / 2``
    (:func:`dynamic_pressure`; by default DrivaerML's free stream, :data:`RHO` and :data:`U_INF`).

    **Shapes**: ``centres``, ``normals``, ``wall_shear`` (N, 3); ``areas``, ``pressure`` (N,).
    """

    def f64(a: np.ndarray | torch.Tensor) -> torch.Tensor:
        return a.to(torch.float64) if isinstance(a, torch.Tensor) else torch.tensor(np.asarray(a), dtype=torch.float64)

    normals, areas = f64(normals), f64(areas)
    cell_force = (-f64(pressure).unsqueeze(-1) * normals + f64(wall_shear)) * areas.unsqueeze(-1)
    fx, fy, fz = (cell_force[:, k] for k in range(3))
    rx, ry, rz = (f64(centres)[:, k] - float(reference_point[k]) for k in range(3))
    force = [float(f.sum(0)) for f in (fx, fy, fz)]
    moment = [float(m.sum(0)) for m in (ry * fz - rz * fy, rz * fx - rx * fz, rx * fy - ry * fx)]
    if reference_area is None:
        reference_area = float((areas * torch.clamp_min(-normals[:, 0], 0.0)).sum(0))
    denom = dynamic_pressure(rho, u_inf) * reference_area
    xref, yref, zref = (float(v) for v in reference_point)
    return {
        "Cd": force[0] / denom,
        "Cl": force[2] / denom,
        "Cs": force[1] / denom,
        "Fx": force[0],
        "Fy": force[1],
        "Fz": force[2],
        "Mx": moment[0],
        "My": moment[1],
        "Mz": moment[2],
        "Aref": reference_area,
        "xref": xref,
        "yref": yref,
        "zref": zref,
        "Uinf": u_inf,
        "rho": rho,
    }


def _graded_nodes(lo: float, hi: float, fine_lo: float, fine_hi: float, num_cells: int) -> np.ndarray:
    """``num_cells + 1`` nodes on [lo, hi], about 4x denser on [fine_lo, fine_hi] with smooth grading."""
    s = np.linspace(lo, hi, 4097)
    density = axis_density(s, fine_lo, fine_hi)
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (density[1:] + density[:-1]) * np.diff(s))])
    nodes = np.interp(np.linspace(0.0, cum[-1], num_cells + 1), cum, s)
    nodes[0], nodes[-1] = lo, hi
    return nodes


def axis_density(s: np.ndarray, fine_lo: float, fine_hi: float) -> np.ndarray:
    d = np.maximum(0.0, np.maximum(fine_lo - s, s - fine_hi))
    return 1.0 + 3.0 * np.exp(-((d / (0.3 * (fine_hi - fine_lo))) ** 2))


def _axis_integral(lo: float, hi: float, fine_lo: float, fine_hi: float) -> float:
    s = np.linspace(lo, hi, 4097)
    return float(np.trapezoid(axis_density(s, fine_lo, fine_hi), s))


# Kuhn's decomposition of a hexahedron into 6 tetrahedra along its main diagonal (corner bits
# are (dx, dy, dz)); every hex uses the same diagonal direction, so neighbouring tets conform.
_KUHN = np.array([[0, 4, 6, 7], [0, 4, 5, 7], [0, 2, 6, 7], [0, 2, 3, 7], [0, 1, 5, 7], [0, 1, 3, 7]], dtype=np.int64)


def _volume_mesh(params: CarParameters, num_cells: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Tetrahedra outside the body in a box above the ground; returns points (V, 3), tets (T, 4)."""
    length, width, height = params.length, params.width, params.height
    boxes = [
        (-0.5 * length, 2.0 * length, 0.0, 1.3 * length),
        (-1.2 * width, 1.2 * width, -0.5 * width, 0.5 * width),
        (0.0, 2.2 * height, 0.0, height),
    ]
    integrals = np.array([_axis_integral(*b) for b in boxes])

    def axis_cells(num_hex: float) -> list[int]:
        h0 = (integrals.prod() / num_hex) ** (1.0 / 3.0)
        return [max(2, round(v / h0)) for v in integrals]

    # The body removes a share of the box; measure it on hex centres and size the grid again.
    num_hex = max(num_cells / 6.0, 8.0)
    counts = axis_cells(num_hex)
    nodes = [_graded_nodes(*b, n) for b, n in zip(boxes, counts)]
    mids = [0.5 * (v[1:] + v[:-1]) for v in nodes]
    centres = np.stack(np.meshgrid(*mids, indexing="ij"), -1).reshape(-1, 3)
    keep = 1.0 - params.inside(centres).mean()
    if keep < 0.995:
        counts = axis_cells(num_hex / keep)
        nodes = [_graded_nodes(*b, n) for b, n in zip(boxes, counts)]

    nx, ny, nz = (len(v) for v in nodes)
    points = np.stack(np.meshgrid(*nodes, indexing="ij"), -1).reshape(-1, 3)
    # Jitter interior nodes by up to 8% of the local spacing: an irregular, still valid mesh.
    spacing = [np.minimum(np.diff(v, prepend=v[1] - v[0]), np.diff(v, append=2 * v[-1] - v[-2])) for v in nodes]
    local = np.stack(np.meshgrid(*spacing, indexing="ij"), -1).reshape(-1, 3)
    interior = [np.r_[False, np.ones(len(v) - 2, dtype=bool), False] for v in nodes]
    inner = np.stack(np.meshgrid(*interior, indexing="ij"), -1).reshape(-1, 3)
    points = points + rng.uniform(-0.08, 0.08, size=points.shape) * local * inner

    i, j, k = np.meshgrid(np.arange(nx - 1), np.arange(ny - 1), np.arange(nz - 1), indexing="ij")
    base = ((i * ny + j) * nz + k).ravel()
    bits = np.array([(b >> 2 & 1, b >> 1 & 1, b & 1) for b in range(8)])
    corner_offsets = (bits[:, 0] * ny + bits[:, 1]) * nz + bits[:, 2]
    corners = base[:, None] + corner_offsets[None, :]  # (H, 8)
    tets = corners[:, _KUHN].reshape(-1, 4)
    tet_centres = points[tets].mean(axis=1)
    tets = tets[~params.inside(tet_centres)]
    p = points[tets]
    det = np.einsum("ij,ij->i", p[:, 1] - p[:, 0], np.cross(p[:, 2] - p[:, 0], p[:, 3] - p[:, 0]))
    flip = det < 0
    tets[flip] = tets[flip][:, [0, 2, 1, 3]]
    return points, tets


def volume_fields(params: CarParameters, centres: np.ndarray) -> dict[str, np.ndarray]:
    """``UMeanTrim`` (N, 3) [m/s], ``pMeanTrim`` (N,) [Pa], ``nutMeanTrim`` (N,) [m^2/s], float32."""
    body = params.height - params.ride_height
    centre = np.array([0.5 * params.length, 0.0, params.ride_height + 0.45 * body])
    semi = np.array([0.5 * params.length, 0.5 * params.width, 0.5 * body])
    q = (centres - centre) / semi
    r = np.maximum(np.linalg.norm(q, axis=1), 1.0)
    kappa = 0.55
    u = np.zeros_like(q)
    u[:, 0] = 1.0
    u += kappa * (0.5 / r**3)[:, None] * np.array([1.0, 0.0, 0.0])
    u -= kappa * (1.5 * q[:, 0] / r**5)[:, None] * q

    x, y, z = centres[:, 0], centres[:, 1], centres[:, 2]
    downstream = np.maximum((x - params.length) / params.length, 0.0)
    onset = _smoothstep(x, 0.5 * (params.roof_end_x + 1.0) * params.length, 0.3 * params.length)
    rear_top = body * params.rear_height
    wy = 0.5 * params.width * (0.9 + 0.35 * downstream)
    wz = 0.5 * rear_top * (0.9 + 0.35 * downstream)
    zw = params.ride_height + 0.5 * rear_top
    wake = onset * np.exp(-((y / wy) ** 2) - ((z - zw) / wz) ** 2) / (1.0 + 0.6 * downstream)
    deficit = 0.45 + 0.35 * params.rear_height
    u[:, 0] *= 1.0 - deficit * wake
    u[:, 1:] *= (1.0 - wake)[:, None]
    cp_base = -0.12 - 0.22 * params.rear_height
    cp = (1.0 - np.einsum("ij,ij->i", u, u)) * (1.0 - wake) + wake * cp_base
    nut = 1.5e-5 + 2e-3 * wake + 5e-4 * np.exp(-(((r - 1.0) / 0.08) ** 2))
    return {
        "UMeanTrim": (u * U_INF).astype(np.float32),
        "pMeanTrim": (cp * _Q_INF).astype(np.float32),
        "nutMeanTrim": nut.astype(np.float32),
    }


def _save_vtk(mesh, path: Path, compression: str | None) -> None:  # noqa: ANN001 (pyvista type)
    mesh.save(str(path), binary=True, compression=compression)


def _write_csv(path: Path, values: dict[str, float]) -> None:
    header = ",".join(values)
    row = ",".join(repr(float(v)) for v in values.values())
    path.write_text(f"{header}\n{row}\n")


def _write_run(
    run_dir: Path,
    run: int,
    params: CarParameters,
    surface_cells: int,
    volume_cells: int,
    rng: np.random.Generator,
    split_volume: bool,
    compression: str | None,
) -> None:
    import pyvista as pv
    import trimesh

    vertices, faces = car_surface(params, surface_cells)
    vertices = vertices.astype(np.float32)  # the files hold float32; derive everything from it
    conn = faces.ravel()
    offsets = np.arange(0, conn.size + 1, 3)
    centres = cell_centres(vertices, conn, offsets)
    normals, areas = polygon_normals_areas(vertices, conn, offsets)
    fields = surface_fields(params, centres, normals)

    surface = pv.PolyData.from_regular_faces(vertices, faces)
    for name, value in fields.items():
        surface.cell_data[name] = value
    _save_vtk(surface, run_dir / f"boundary_{run}.vtp", compression)
    trimesh.Trimesh(vertices, faces, process=False).export(run_dir / f"drivaer_{run}.stl")

    reference = (0.5 * params.length, 0.0, 0.0)
    forces = integrate_forces(
        centres, normals, areas, fields["pMeanTrim"], fields["wallShearStressMeanTrim"], reference
    )
    _write_csv(run_dir / f"force_mom_{run}.csv", forces)
    _write_csv(run_dir / f"geo_parameters_{run}.csv", asdict(params))

    if volume_cells > 0:
        points, tets = _volume_mesh(params, volume_cells, rng)
        points = points.astype(np.float32)
        grid = pv.UnstructuredGrid({pv.CellType.TETRA: tets}, points)
        tet_centres = points[tets].astype(np.float64).mean(axis=1)
        for name, value in volume_fields(params, tet_centres).items():
            grid.cell_data[name] = value
        path = run_dir / f"volume_{run}.vtu"
        _save_vtk(grid, path, compression)
        if split_volume:
            data = path.read_bytes()
            half = len(data) // 2
            (run_dir / f"volume_{run}.vtu.00.part").write_bytes(data[:half])
            (run_dir / f"volume_{run}.vtu.01.part").write_bytes(data[half:])
            path.unlink()


def make_synthetic_drivaerml(
    out_dir: str | os.PathLike[str],
    num_runs: int,
    surface_cells: int = 20_000,
    volume_cells: int = 50_000,
    seed: int = 0,
    *,
    split_volume: bool = False,
    first_run: int = 1,
    compression: str | None = None,
) -> list[Path]:
    """Write ``num_runs`` synthetic runs in the DrivaerML layout (``out_dir/run_i/...``).

    Parameters
    ----------
    out_dir:
        Folder to create or fill; existing run folders of the same index are overwritten.
    num_runs:
        Number of runs, numbered ``first_run, first_run + 1, ...`` (DrivaerML counts from 1).
    surface_cells:
        Approximate number of surface triangles per run (the exact count is
        ``2 * n_around * n_rings``, within about 3% of the request).
    volume_cells:
        Approximate number of volume tetrahedra per run; 0 writes no volume file.
    seed:
        Run ``i`` draws its geometry and jitter from ``SeedSequence([seed, i])``: the output is
        a pure function of ``(seed, i, sizes)``.
    split_volume:
        Write ``volume_i.vtu.00.part`` and ``.01.part`` (byte halves) instead of ``volume_i.vtu``,
        as the real data set is distributed.
    compression:
        VTK XML compression (``None``, ``"zlib"``, ``"lz4"``, ``"lzma"``); ``None`` is fastest.

    Returns
    -------
    list of Path
        The run folders, in run order.

    Examples
    --------
    >>> import tempfile, meshshard as ms
    >>> runs = ms.datasets.make_synthetic_drivaerml(tempfile.mkdtemp(), 2, 2000, 0)
    >>> sorted(p.name for p in runs[0].iterdir())  # doctest: +NORMALIZE_WHITESPACE
    ['boundary_1.vtp', 'drivaer_1.stl', 'force_mom_1.csv', 'geo_parameters_1.csv']
    """
    for name, value in (
        ("num_runs", num_runs),
        ("surface_cells", surface_cells),
        ("volume_cells", volume_cells),
    ):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int (got {type(value).__name__})")
    check_positive_int(num_runs, "num_runs")
    if surface_cells < 32:
        raise ValueError(f"surface_cells must be at least 32 (got {surface_cells})")
    if volume_cells < 0:
        raise ValueError(f"volume_cells must be non-negative (got {volume_cells})")
    if split_volume and volume_cells == 0:
        raise ValueError("split_volume=True needs volume_cells > 0 (got volume_cells=0)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run_dirs = []
    for run in range(first_run, first_run + num_runs):
        rng = np.random.default_rng(np.random.SeedSequence([seed, run]))
        params = CarParameters.sample(rng)
        run_dir = out / f"run_{run}"
        run_dir.mkdir(exist_ok=True)
        _write_run(run_dir, run, params, surface_cells, volume_cells, rng, split_volume, compression)
        run_dirs.append(run_dir)
    return run_dirs
