-- One PostgreSQL for both servers: MLflow's tracking/registry store and Prefect's database.
CREATE DATABASE mlflow;
CREATE DATABASE prefect;
