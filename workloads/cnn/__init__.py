"""3D CNN workloads (CosmoFlow, 3D U-Net, layer lists) under spatial x data parallelism."""
